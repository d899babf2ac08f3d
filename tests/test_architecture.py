"""The shape of runner/: its layers point one way (the contracts in pyproject.toml, checked by import-linter),
a contract that is broken fails, the bundled recipes use only the public API, every environment class reads
only the variables it declares, and the private APIs of other packages that the runner relies on are still
there (each would otherwise fail deep inside a run after an upgrade)."""

from __future__ import annotations

import ast
import importlib.util
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from conftest import REPO
from sources import nodes


LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_layers_point_one_way() -> None:
    done = lint_imports(REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 2 kept, 0 broken." in done.stdout


def test_an_import_from_a_lower_layer_to_a_higher_one_breaks_the_contract(tmp_path) -> None:
    """The check is real: a copy of runner/ in which the plan imports a launcher fails it, naming the import."""
    shutil.copytree(REPO / "runner", tmp_path / "runner", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    render = tmp_path / "runner" / "plan" / "render.py"
    render.write_text(render.read_text() + "\nfrom runner.launchers.base import Launcher  # a deliberate violation\n")
    done = lint_imports(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "runner.plan is not allowed to import runner.launchers" in done.stdout
    assert "runner.plan.render -> runner.launchers.base" in done.stdout


def _imports(path: Path) -> Iterator[str]:
    for node in nodes(path):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names)


@pytest.mark.unit
def test_the_bundled_recipes_use_the_public_api_only() -> None:
    """recipes/ ships as runner.recipes, outside runner/'s folder (so import-linter does not see it)."""
    used = {m for path in (REPO / "recipes").glob("*.py") for m in _imports(path) if m.startswith("runner")}
    assert used and used <= {"runner.api"}, used


class _Recording(Mapping[str, str]):
    """An environment that remembers which variables were asked for."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values, self.asked = values, set()

    def __getitem__(self, key: str) -> str:
        self.asked.add(key)
        return self.values[key]

    def get(self, key, default=None):
        self.asked.add(key)
        return self.values.get(key, default)

    def __contains__(self, key: object) -> bool:
        self.asked.add(key)
        return key in self.values

    def __iter__(self):
        raise AssertionError("an environment class lists the whole environment instead of reading its variables")

    def __len__(self) -> int:
        return len(self.values)


@pytest.mark.unit
def test_each_environment_class_reads_the_variables_it_declares_and_no_others() -> None:
    from runner.environments import mpi, process, slurm

    for module, read in ((slurm, slurm.SlurmEnvironment.read), (mpi, mpi.MpiEnvironment.read)):
        env = _Recording({})
        read(env)
        declared = set(module.VARIABLES) if isinstance(module.VARIABLES, dict) and module is slurm else \
            {v for names in module.VARIABLES.values() for v in names}
        assert env.asked and env.asked <= declared, (module.__name__, env.asked - declared)
    env = _Recording({})
    process.ProcessEnvironment.read(env)
    declared = set(process.VARIABLES) | set(slurm.VARIABLES) | {v for names in mpi.VARIABLES.values() for v in names}
    assert env.asked <= declared, env.asked - declared


_MUTATORS = ("append", "extend", "insert", "remove", "pop", "clear", "add", "update", "setdefault", "discard")


def _class_state_writes(walked: tuple[ast.AST, ...], classes: set[str]) -> Iterator[tuple[int, str]]:
    """Writes to a class's attribute, ``Name.attr`` for a class of the runner's or ``cls.attr``: assigned, or a
    container there changed in place (``Name.attr.append(...)``)."""
    def of_a_class(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
            (node.value.id in classes or node.value.id == "cls")

    for node in walked:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _MUTATORS:
            targets = [node.func.value]
        for target in targets:
            if of_a_class(target):
                yield node.lineno, f"{target.value.id}.{target.attr}"  # type: ignore[attr-defined]


@pytest.mark.unit
def test_no_process_state_lives_in_class_attributes() -> None:
    """What a process knows (its stop request, its channel to its host agent, a sweep's outcome) is an object made
    and handed down, never a class attribute written from wherever (class attributes stay constants)."""
    paths = [*sorted((REPO / "runner").rglob("*.py")), *sorted((REPO / "hydra_plugins").rglob("*.py"))]
    walked = {path: nodes(path) for path in paths}
    classes = {node.name for found in walked.values() for node in found if isinstance(node, ast.ClassDef)}
    writes = [f"{path.relative_to(REPO)}:{line}: {what}" for path, found in walked.items()
              for line, what in _class_state_writes(found, classes)]
    assert writes == []


# ------------------------------------------------------------------------------ other packages' private APIs


@pytest.mark.unit
def test_nothing_of_the_runner_uses_hydras_internals() -> None:
    """``hydra._internal`` changes without notice between Hydra's releases: the runner uses Hydra's public API only
    (topology=NxM is a ConfigStore entry, runner.app.topology_shapes), named, imported or as a string."""
    used = [f"{path.relative_to(REPO)}:{n}: {line.strip()}"
            for folder in ("runner", "hydra_plugins", "recipes") for path in sorted((REPO / folder).rglob("*.py"))
            for n, line in enumerate(path.read_text().splitlines(), 1) if "hydra._internal" in line]
    assert used == []
    imported = [m for folder in ("runner", "hydra_plugins") for path in (REPO / folder).rglob("*.py")
                for m in _imports(path) if m == "hydra._internal" or m.startswith("hydra._internal.")]
    assert imported == []


@pytest.mark.unit
def test_the_hydra_internal_the_tests_compose_with_is_still_there() -> None:
    """tests/conftest.py's compose_config sets plain keys with Hydra's own ConfigLoaderImpl._apply_overrides_to_config
    (a private API, for speed: test_fixtures.py checks it composes what `run` does): a canary that names it after a
    Hydra upgrade that changed it, instead of every test that composes a spec failing at once."""
    import inspect

    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    assert list(inspect.signature(ConfigLoaderImpl._apply_overrides_to_config).parameters) == ["overrides", "cfg"]
    cfg = OmegaConf.create({"a": {"b": 1}})
    ConfigLoaderImpl._apply_overrides_to_config(OverridesParser.create().parse_overrides(["a.b=2", "+a.c=3"]), cfg)
    assert OmegaConf.to_container(cfg) == {"a": {"b": 2, "c": 3}}


@pytest.mark.unit
def test_optimizer_internals_the_sharding_strategies_empty() -> None:
    """runner.training.sharding drops the gathered shards that fairscale's OSS (``_all_states``) and torch's
    ZeroRedundancyOptimizer (``_all_state_dicts``) keep after consolidating, or rank 0 would hold every
    rank's optimizer state for the rest of the run: the attributes must still exist (read in the installed sources:
    importing fairscale is half a second of this test)."""
    def attributes_used(package: str, module: str, cls: str, method: str) -> set[str]:
        source = Path(importlib.util.find_spec(package).origin).parent.joinpath(*module.split("/"))  # no import
        (found,) = [f for c in ast.parse(source.read_text()).body if isinstance(c, ast.ClassDef) and c.name == cls
                    for f in c.body if isinstance(f, ast.FunctionDef) and f.name == method]
        return {n.attr for n in ast.walk(found) if isinstance(n, ast.Attribute)}

    assert "_all_states" in attributes_used("fairscale", "optim/oss.py", "OSS", "consolidate_state_dict")
    assert "_all_state_dicts" in attributes_used("torch", "distributed/optim/zero_redundancy_optimizer.py",
                                                 "ZeroRedundancyOptimizer", "consolidate_state_dict")


def test_torch_reads_the_default_timeouts_the_runner_sets_for_scripts() -> None:
    """A torchrun-style script's process group made without a timeout gets init.timeout_s because torch
    reads these module attributes when ``timeout`` is None (runner.worker.rank sets both)."""
    import datetime

    import torch.distributed.distributed_c10d as c10d

    saved = c10d.default_pg_timeout, c10d.default_pg_nccl_timeout
    try:
        c10d.default_pg_timeout = c10d.default_pg_nccl_timeout = datetime.timedelta(seconds=7)
        assert c10d._get_default_timeout(c10d.Backend.GLOO) == datetime.timedelta(seconds=7)
        assert c10d._get_default_timeout(c10d.Backend.NCCL) == datetime.timedelta(seconds=7)
    finally:
        c10d.default_pg_timeout, c10d.default_pg_nccl_timeout = saved


FLIGHT_RECORDER = """
import os, sys, tempfile, time
import torch, torch.distributed as dist
from runner.worker.watch import _fr_dump, _groups_from_fr
os.environ["TORCH_FR_BUFFER_SIZE"] = "20"
dist.init_process_group("gloo", init_method="file://" + os.path.join(tempfile.mkdtemp(), "rdzv"), rank=0, world_size=1)
dist.all_reduce(torch.ones(3))
deadline = time.monotonic() + 60
while True:  # the recorder marks a collective completed a moment after it returns (late on a busy machine)
    doc = _fr_dump()
    assert doc is not None, "no flight-recorder document"
    (group,) = _groups_from_fr(doc)
    if group.completed == group.enqueued or time.monotonic() > deadline:
        break
    time.sleep(0.05)
print(group.enqueued, group.completed, [(c.seq, c.op, c.sizes) for c in group.entries])
status = _fr_dump(entries=False)  # what the watch asks every tick: the groups' status without the entries
print(sorted(status), [(s["last_enqueued_collective"], s["last_completed_collective"]) for s in status["pg_status"].values()])
dist.destroy_process_group()
"""


# not marked unit: it starts a process with a process group (the suite, not `pytest -m unit`, runs it)
def test_the_flight_recorder_dump_the_hang_report_reads() -> None:
    """runner.worker.watch reads a rank's collectives from torch's flight recorder through a private function
    (``torch._C._distributed_c10d._dump_fr_trace_json``) and parses its JSON: both must still be what they were
    (otherwise a hang report silently falls back to the runner's own counter of collectives)."""
    import torch

    assert callable(torch._C._distributed_c10d._dump_fr_trace_json)
    done = subprocess.run([sys.executable, "-P", "-c", FLIGHT_RECORDER], capture_output=True, text=True, timeout=120,
                          cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split("\n")[0] == "1 1 [(1, 'all_reduce', ((3,),))]", done.stdout
    status_keys, counts = done.stdout.split("\n")[1].split("] [")
    assert "'pg_status'" in status_keys and "'entries'" not in status_keys, done.stdout
    assert counts == "('1', '1')]", done.stdout
