"""Every name README.md and docs/ give in inline code outside its commands is the code's: a config key (`launcher.ssh.export`,
`backend.pick_interface=false`) is a field of the schema (runner.spec.schema), with a value its type takes where
the type has choices; a group's option (`sharding=fsdp`, `hydra/launcher=runner`) is one `run` offers; an
environment variable (`RUNNER_ATTEMPT`) is one this checkout's code, or torch's, names; and the keys the prose
lists bare (`partition`, `account`, ... under `launcher.slurm`; a host's `name`, `addr`, ...) are the schema's.
The commands themselves compose and validate in test_readme_commands.py."""

from __future__ import annotations

import dataclasses
import functools
import re
import typing
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra.core.config_store import ConfigStore

import runner.app.cli
from conftest import REPO, config_groups
from readme_text import code_of, docs
from runner.spec.schema import RECIPE_SCHEMAS, DeviceKind, HostConfig, JobConfig, RecipeConfig, SlurmOptions
from test_readme_tables import NOT_OFFERED

pytestmark = pytest.mark.docs

GROUPS = ("topology", "init", "launcher", "backend", "parallel", "sharding", "recipe", "log")
_KEY = re.compile(rf"(?<![\w./=-])\+?((?:{'|'.join(GROUPS)})\.[\w.]+)(?:=(\S+))?")
_OPTION = re.compile(r"(?<![\w./=+-])((?:\w+/)?\w+)=([\w.-]+)")
_VARIABLE = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")


def _spans() -> list[tuple[str, str]]:
    """(where, text) of every inline code span that is not a command (those are test_readme_commands.py's)."""
    found = []
    for span in docs().spans:
        text = " ".join(span.text.split())
        if not text.startswith(("run ", ".venv/bin/run", "$ ")):
            found.append((f"{span.page}:{span.line}", text))
    return found


def _optional(hint: Any) -> Any:
    """``Optional[X]`` as ``X``."""
    if typing.get_origin(hint) is typing.Union:
        [hint] = [a for a in typing.get_args(hint) if a is not type(None)]
    return hint


@functools.cache
def _hints(schema: type) -> dict[str, Any]:
    return typing.get_type_hints(schema)


def field_type(key: str) -> Any:
    """The type of the schema's field a dotted key names (a recipe's key: any recipe schema's; a key below a mapping,
    as `backend.env.NAME`: the mapping's values'); KeyError when no schema has it."""
    schemas: list[type] = [JobConfig]
    hint: Any = None
    for part in key.split("."):
        if typing.get_origin(hint) is dict:
            hint, schemas = typing.get_args(hint)[1], []
            continue
        found = [_hints(s)[part] for s in schemas if part in {f.name for f in dataclasses.fields(s)}]
        if not found:
            raise KeyError(key)
        hint = _optional(found[0])
        if schemas == [JobConfig] and part == "recipe":
            schemas = list(RECIPE_SCHEMAS.values())
        elif dataclasses.is_dataclass(hint):
            schemas = [hint]
        else:
            schemas = []
    return hint


def named_keys() -> dict[str, list[tuple[str, str | None]]]:
    """Every config key an inline span names -> where, and the value it gives (or None), each time."""
    found: dict[str, list[tuple[str, str | None]]] = {}
    for where, text in _spans():
        for m in _KEY.finditer(text):
            found.setdefault(m[1], []).append((where, m[2]))
    return found


KEYS = named_keys()


def test_the_readme_names_keys() -> None:
    assert len(KEYS) >= 40, KEYS


@pytest.mark.parametrize("key", sorted(KEYS))
def test_every_key_the_readme_names_is_the_schemas(key: str) -> None:
    """A key is a field of the schema; a value of an enum's or a bool's is one of its choices."""
    try:
        hint = field_type(key)
    except KeyError:
        pytest.fail(f"{KEYS[key][0][0]}: `{key}` is no key of the schema (runner/spec/schema.py)")
    for where, value in KEYS[key]:
        if value is None:
            continue
        if isinstance(hint, type) and issubclass(hint, Enum):
            assert value in [m.value for m in hint], f"{where}: `{key}={value}`: one of {[m.value for m in hint]}"
        elif hint is bool:
            assert value in ("true", "false"), f"{where}: `{key}={value}`: true or false"


def _offered(group: str) -> list[str]:
    """The options of a group `run` offers: its config files (a user may not pick those NOT_OFFERED, but the README
    names them to say so), a device's choices, Hydra's launchers (ours registered as `run` registers it)."""
    if group == "device":
        return [d.value for d in DeviceKind]
    if group.startswith("hydra/"):
        runner.app.cli.register()
        return [name.removesuffix(".yaml") for name in ConfigStore.instance().list(group)]
    import importlib.resources

    shipped = importlib.resources.files("runner.conf").joinpath(group)
    return [p.name.removesuffix(".yaml") for p in shipped.iterdir() if p.name.endswith(".yaml")] + \
        [option for g, option in NOT_OFFERED if g == group]


OPTIONS = {(m[1], m[2]): where for where, text in reversed(_spans()) for m in _OPTION.finditer(text)
           if m[1] in (*config_groups(), "device", "hydra/launcher")}  # -> where first named


def test_the_readme_names_options() -> None:
    assert len(OPTIONS) >= 20, OPTIONS


@pytest.mark.parametrize("group, option", sorted(OPTIONS), ids=[f"{g}={o}" for g, o in sorted(OPTIONS)])
def test_every_option_the_readme_names_is_offered(group: str, option: str) -> None:
    """`launcher=ssh`, `sharding=fsdp`, `device=cuda`, `hydra/launcher=runner`; `topology=NxM` any shape."""
    if option == "...":
        return
    if group == "topology" and re.fullmatch(r"\d+x\d+", option):
        return
    assert option in _offered(group), \
        f"{OPTIONS[group, option]}: `{group}={option}`: {group} offers {sorted(_offered(group))}"


# --------------------------------------------------------------------------- environment variables


@functools.cache
def _sources() -> str:
    """The text of this checkout's code and scripts, and of torch.distributed (torchrun's own variables)."""
    files = [p for folder in ("runner", "scripts", "benchmarks", "hydra_plugins", "recipes")
             for p in (REPO / folder).rglob("*") if p.suffix in (".py", ".sh")]
    files += (Path(torch.__file__).parent / "distributed").rglob("*.py")
    return "\n".join(p.read_text(errors="replace") for p in files)


VARIABLES = {m[0]: where for where, text in reversed(_spans())
             if (m := _VARIABLE.match(text)) and re.fullmatch(rf"{m[0]}(=\S*)?( .*)?", text)}  # -> where first named


def test_the_readme_names_variables() -> None:
    assert len(VARIABLES) >= 30, VARIABLES


@pytest.mark.parametrize("name", sorted(VARIABLES))
def test_every_variable_the_readme_names_is_one_the_code_names(name: str) -> None:
    """`RUNNER_ATTEMPT`, `TORCH_FR_BUFFER_SIZE`, `TORCHELASTIC_SIGNALS_TO_HANDLE`, `NODE_FAIL`: a word of this
    checkout's code or of torch.distributed's."""
    assert re.search(rf"\b{name}\b", _sources()), \
        f"{VARIABLES[name]}: `{name}` is named nowhere in the code (nor torch's)"


# --------------------------------------------------------------------------- keys the prose lists bare


def _flat() -> str:
    return " ".join(docs().text.split())


def test_the_slurm_keys_listed_are_launcher_slurms() -> None:
    """"`partition`, `account`, `qos`, `time`, `mem`, `cpus_per_task` and `extra` `#SBATCH` lines are under
    `launcher.slurm`"."""
    listed = re.search(r"((?:`\w+`,? )+and `\w+`) `#SBATCH` lines are under `launcher\.slurm`", _flat())
    assert listed is not None
    names = code_of(listed[1])
    assert len(names) >= 5 and set(names) <= {f.name for f in dataclasses.fields(SlurmOptions)}, names


def test_a_hosts_keys_are_the_schemas() -> None:
    """"each host with `name` (...), `addr` (...), `devices` and `gpus` (...)": every key of a host, none other."""
    listed = re.search(r"each host with ((?:`\w+`(?: \([^)]*\))?(?:, | and ))+`\w+`)", _flat())
    assert listed is not None
    assert sorted(code_of(listed[1])) == sorted(f.name for f in dataclasses.fields(HostConfig)), listed[1]


def test_the_recipe_keys_the_runner_reads_are_the_schemas() -> None:
    """"`target`, `global_batch_size` and `seed` are read by the runner": the keys of every recipe's schema that are
    not one recipe's own (RecipeConfig's, but whether the runner makes the process group)."""
    listed = re.search(r"any keys; ((?:`\w+`,? )+and `\w+`) are read by the runner", _flat())
    assert listed is not None
    read = {f.name for f in dataclasses.fields(RecipeConfig)} - {"init_process_group"}
    assert sorted(code_of(listed[1])) == sorted(read)


def test_the_devices_are_the_schemas() -> None:
    """"`device=auto|cuda|cpu`"."""
    listed = re.search(r"`device=([\w|]+)`", _flat())
    assert listed is not None
    assert listed[1].split("|") == [d.value for d in DeviceKind]
