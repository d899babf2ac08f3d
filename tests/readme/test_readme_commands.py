"""Every command of README.md and the pages of docs/ does what it says, checked in-process (nothing is launched):

* each `run ...` of a ```bash block, each ``$ run ...`` of an output sample and each inline `run ...` composes
  (Hydra, pkg://runner.conf, `--config-dir` as `run` takes it) and passes validation the way `run` would, every
  job of a sweep (`-m`) included; script forms (`run ... -- train.py`) go through `run`'s own rewriting first;
  a command with a placeholder is skipped only for a reason listed in SKIPPED;
* every other command of a ```bash block runs a script of this checkout, with options that script has (also those
  its comment names);
* the `mpirun` line "Launchers" shows is the one launcher=mpi builds;
* a job file shown in the README composes and validates as a job file of a user's folder.
"""

from __future__ import annotations

import itertools
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_dir, initialize_config_module
from hydra.core.override_parser.overrides_parser import OverridesParser

import runner.app.cli
from conftest import REPO, compose, environment, hosts_override, validate
from readme_text import code_of, docs
from runner.app.cli import typed_spec
from runner.app.script_shorthand import ScriptArgsError, script_overrides
from runner.launchers import Invocation, plan_for
from runner.launchers import validate as check
from runner.launchers.mpi import MpiLauncher
from runner.records.paths import RunPaths
from runner.spec.pins import pinned
from runner.spec.probe import FixedProbe
from runner.spec.problems import render_problems
from runner.spec.schema import JobConfig

pytestmark = pytest.mark.docs

# Commands with a placeholder the reader fills in, or that are not a job: command -> why it is not validated.
SKIPPED = {
    "run … -- train.py": "shorthand for the section's subject, any `run` line with a script",
    "run -- -m pkg.train": "pkg.train stands for the user's module (`-- -m` itself is checked in "
                           "tests/app/test_script_shorthand.py)",
    "run -m": "names Hydra's multirun flag, not a command",
    "run ... preflight=true": "`...` stands for any job's overrides",
    "run -m hydra/launcher=submitit_slurm ...": "refused on purpose (tests/app/test_sweep_launchers.py)",
    "run --help": "Hydra's help: no job",
    "run --version": "prints the versions: no job (tests/app/test_cli.py checks what it prints)",
    "run 0.1.0 (torch-jobspec), torch 2.13.0+cpu, Python 3.11.7 (<interpreter>)": "what `run --version` prints",
    "run ... launcher=ssh": "`...` stands for any job's overrides",
    "run --ssh-host": "what launcher=ssh starts on each host, not a user's command (tests/app/test_cli.py: typed by "
                      "hand it says so; tests/e2e/test_ssh.py runs it)",
    "run --config-dir jobs topology=mycluster": "shows how a user's option is picked, not a whole job (mycluster's "
                                                "2+1 hosts need a launcher of several hosts)",
    "run topology=hetero_2_1 recipe.global_batch_size=2": "refused on purpose: the dry run's example of an invalid "
                                                          "spec (test_the_invalid_spec_shown_is_what_validation_says)",
    "run topology=1x4 sharding=fsdp recipe.resume=outputs/.../checkpoints/last.pt":
        "`...` stands for an earlier run's folder",
}

# Scripts and modules of the user's own repository that the README's commands name: assumed to be there.
USERS_SCRIPTS = {"train.py", "old_train.py", "tiny.py", "asr/train.py"}
# Where a section's commands run (README: "Run them from `examples/migrate/`"); the tests' scripts elsewhere.
FOLDERS = {"Moving an existing launch to a job file": REPO / "examples" / "migrate",
           "A job over ssh": REPO / "examples" / "ssh", "When a host is lost": REPO / "examples" / "ssh"}
TESTS_SCRIPTS = REPO / "tests" / "scripts"

_PLACEHOLDER = re.compile(r"\.\.\.|…|<[^>]*>")


@dataclass(frozen=True)
class Command:
    """One command of the README: where it is, its words (after the shell's quoting) and what it runs in."""

    where: str  # <page>:<line> (<section>): README.md:12 (Quick start), docs/ssh.md:40 (A job over ssh)
    text: str
    argv: tuple[str, ...]
    folder: Path | None = None


def _simple_commands(line: str) -> Iterator[list[str]]:
    """The simple commands of a shell line (split at &&, ||, ;, |), comments dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words: list[str] = []
    for token in lexer:
        if token and set(token) <= set(";&|"):
            if words:
                yield words
            words = []
        else:
            words.append(token)
    if words:
        yield words


def _run_argv(words: list[str]) -> list[str] | None:
    """`run`'s arguments in a simple command (also after sudo, salloc's options, .venv/bin/run); None: no `run`."""
    for i, word in enumerate(words):
        if word in ("run", ".venv/bin/run"):
            return words[i + 1:]
    return None


def _shell_lines() -> Iterator[tuple[str, str, str]]:
    """(where, section, line) of every line of the ```bash blocks, and of the `$ ` lines of the other blocks."""
    for block in docs().blocks:
        for offset, line in enumerate(block.lines):
            where = f"{block.page}:{block.line + offset} ({block.section})"
            if block.language == "bash":
                yield where, block.section, line
            elif block.language == "" and line.startswith("$ "):
                yield where, block.section, line[2:]


def run_commands() -> list[Command]:
    found = []
    for where, section, line in _shell_lines():
        for words in _simple_commands(line):
            argv = _run_argv(words)
            if argv is not None:
                found.append(Command(where, line.split("#")[0].strip(), tuple(argv), FOLDERS.get(section)))
    for span in docs().spans:
        text = " ".join(span.text.split())
        if text.startswith(("run ", ".venv/bin/run")):
            found.append(Command(f"{span.page}:{span.line} ({span.section})", text, tuple(shlex.split(text)[1:]),
                                 FOLDERS.get(span.section)))
    return found


def other_commands() -> list[tuple[str, list[str]]]:
    found = []
    for where, _, line in _shell_lines():
        for words in _simple_commands(line):
            if _run_argv(words) is None:
                found.append((where, words))
    return found


COMMANDS = run_commands()
CHECKED = [c for c in COMMANDS if c.text not in SKIPPED]


def test_the_readme_has_its_commands_and_every_skip_is_still_there() -> None:
    assert len(CHECKED) >= 30, [c.text for c in CHECKED]
    texts = {c.text for c in COMMANDS}
    assert not set(SKIPPED) - texts, f"SKIPPED names commands the README no longer has: {set(SKIPPED) - texts}"
    for c in CHECKED:
        assert not any(_PLACEHOLDER.search(word) for word in c.argv), \
            f"{c.where}: `{c.text}` has a placeholder: list it in SKIPPED with the reason"


# --------------------------------------------------------------------------- composing as `run` does


def _sweep(overrides: list[str]) -> list[list[str]]:
    """The jobs of `run -m <overrides>`: every combination of the comma-separated values (Hydra's basic sweeper)."""
    choices = []
    for override in OverridesParser.create().parse_overrides(overrides):
        if override.is_sweep_override():
            key = override.get_key_element()
            choices.append([f"{key}={value}" for value in override.sweep_string_iterator()])
        else:
            choices.append([override.input_line])
    return [list(job) for job in itertools.product(*choices)]


def _compose_in(folder: Path, config_name: str, overrides: list[str]) -> JobConfig:
    """`run --config-dir <folder> --config-name <name> <overrides>`: the user's folder and runner.conf both searched,
    the primary config from whichever has it."""
    runner.app.cli.register(overrides)
    folder = folder.resolve()
    if (folder / f"{config_name}.yaml").is_file():
        context, other = initialize_config_dir(config_dir=str(folder), version_base=None), "pkg://runner.conf"
    else:
        context, other = initialize_config_module(config_module="runner.conf", version_base=None), f"file://{folder}"
    with context:
        cfg = hydra_compose(config_name=config_name, overrides=[*overrides, f"hydra.searchpath=[{other}]"])
    return typed_spec(cfg)  # (SpecRefused: a README command whose spec is refused fails here, saying why)


def specs_of(argv: list[str], folder: Path | None) -> list[JobConfig]:
    """The typed specs `run <argv>` composes, started in ``folder``: one, or one per job of a sweep."""
    argv = script_overrides(list(argv))
    config_dir, config_name, multirun, overrides = None, "job", False, []
    words = iter(argv)
    for word in words:
        if word in ("-m", "--multirun"):
            multirun = True
        elif word in ("--config-dir", "-cd"):
            config_dir = next(words)
        elif word in ("--config-name", "-cn"):
            config_name = next(words)
        elif word in ("--cfg", "-c"):
            next(words)  # prints the spec it composes
        else:
            assert not word.startswith("-"), f"a flag this test does not know: {word}"
            overrides.append(word)
    specs = []
    for job in _sweep(overrides) if multirun else [overrides]:
        if config_dir is None and config_name == "job":
            specs.append(compose(*job))
        else:
            assert folder is not None, "a --config-dir command needs its section's folder in FOLDERS"
            specs.append(_compose_in(folder / (config_dir or "."), config_name, job))
    return specs


def probe_for(spec: JobConfig, folder: Path | None) -> FixedProbe:
    """This machine as the command expects it: GPUs for a job on GPUs, and the script it names."""
    paths = set()
    script = getattr(spec.recipe, "path", None)
    if script is not None:
        here = [f for f in (folder, TESTS_SCRIPTS) if f is not None and (f / script).is_file()]
        assert here or script in USERS_SCRIPTS, f"the script {script} is nowhere: add it to USERS_SCRIPTS?"
        paths.add(script)
    gpus = "cuda" in (spec.device.value, spec.backend.name.value)
    return FixedProbe(cuda_devices=16 if gpus else 0, paths=frozenset(paths))


@pytest.mark.parametrize("command", CHECKED, ids=[f"{c.where.split()[0]} {c.text}" for c in CHECKED])
def test_every_run_command_composes_and_validates(command: Command) -> None:
    for spec in specs_of(list(command.argv), command.folder):
        job, problems = check(spec, probe_for(spec, command.folder))
        errors = [p.render() for p in problems if p.severity.value == "error"]
        assert job is not None and not errors, f"{command.where}: `{command.text}`:\n" + "\n".join(errors)


def test_the_readmes_job_file_composes_as_a_users_job_file(tmp_path) -> None:
    """The job file of "Your own job files", saved under the name its first line gives, composes and validates
    with the command that line gives."""
    [block] = [b for b in docs().blocks if b.language == "yaml" and "- job" in map(str.strip, b.lines)]
    name, command = re.fullmatch(r"# (jobs/[\w-]+\.yaml) +(run .+)", block.lines[0]).groups()
    (tmp_path / name).parent.mkdir(parents=True)
    (tmp_path / name).write_text("\n".join(block.lines) + "\n")
    [spec] = specs_of(shlex.split(command)[1:], tmp_path)
    job, problems = check(spec, probe_for(spec, tmp_path))
    assert job is not None, "\n".join(p.render() for p in problems)
    assert (spec.recipe.path, spec.launcher.slurm.time) == ("asr/train.py", "12:00:00")


def test_the_ssh_sections_topology_is_the_example_shipped() -> None:
    """"A job over ssh" shows examples/ssh/jobs/topology/boxes.yaml, which its commands run with."""
    [block] = [b for b in docs().blocks if b.language == "yaml" and b.lines[0].startswith("# jobs/topology/boxes")]
    assert "\n".join(block.lines) + "\n" == (REPO / "examples" / "ssh" / "jobs" / "topology" / "boxes.yaml").read_text()


def test_the_script_shorthand_means_what_the_readme_says() -> None:
    """`run topology=1x4 -- train.py --lr=0.1 --out=/tmp/x` "means" the overrides the README spells out."""
    section = docs().section("Unchanged torchrun-style scripts")
    meant = re.search(r"it means\s+`([^`]+)`", section)[1]
    said = re.search(r"run topology=1x4 -- (train\.py --lr=0\.1 --out=/tmp/x)", section)[1]
    assert compose(*shlex.split(meant)).recipe == compose(*script_overrides(["--", *said.split()])).recipe


def test_torchruns_options_are_refused_with_what_the_readme_says() -> None:
    """"torchrun's own options are refused with what they are here: `--nproc-per-node=4` → `topology=1x4`, ..."."""
    section = " ".join(docs().section("Differences from torchrun").split())
    pairs = re.findall(r"((?:`--[\w-]+(?:=\w+)?`/?)+) → (`[^`]+`(?:/`[^`]+`)?|nothing)", section)
    assert len(pairs) == 6, pairs
    for flags, here in pairs:
        flags, here = code_of(flags), code_of(here) or [here]
        for flag, meant in zip(flags, here * len(flags) if len(here) == 1 else here, strict=True):
            with pytest.raises(ScriptArgsError) as refused:
                script_overrides([flag, "--", "train.py"])
            assert f"here: {meant}" in str(refused.value), (flag, meant, str(refused.value))


# --------------------------------------------------------------------------- the other commands


def _script_path(words: list[str]) -> tuple[Path, list[str]] | None:
    """The checkout's script a command runs (bash X, python X, X itself, after sudo/eval) and its arguments."""
    words = [w for word in words for w in (shlex.split(word[2:-1]) if word.startswith("$(") else [word])]
    for i, word in enumerate(words):
        if re.fullmatch(r"(scripts|benchmarks)/[\w/.-]+", word):
            return REPO / word, words[i + 1:]
    return None


def _script_options(script: Path) -> str:
    source = script.read_text()
    if script == REPO / "scripts" / "testbed.py":  # the command; its options are its package's (scripts/bed/)
        source += "".join(p.read_text() for p in sorted((REPO / "scripts" / "bed").glob("*.py")))
    return source


def _has_option(source: str, option: str) -> bool:
    return f'"{option}"' in source or f"{option})" in source or f"{option}=" in source or f"{option} " in source


OTHERS = other_commands()


@pytest.mark.parametrize("where, words", OTHERS, ids=[f"{w.split()[0]} {' '.join(ws)}" for w, ws in OTHERS])
def test_every_other_command_runs_a_script_of_this_checkout_with_options_it_has(where: str, words: list[str]) -> None:
    if words[0] in ("sinfo", "salloc", "ssh"):
        return  # Slurm's own (the `run` after && or salloc is checked above), the system's ssh client
    found = _script_path(words)
    assert found is not None, f"{where}: `{' '.join(words)}` runs nothing of this checkout"
    script, args = found
    assert script.is_file(), f"{where}: {script.relative_to(REPO)} does not exist"
    source = _script_options(script)
    for option in (a.split("=")[0] for a in args if a.startswith("--")):
        assert _has_option(source, option), f"{where}: {script.relative_to(REPO)} has no option {option}"


def test_every_option_a_commands_comment_names_is_its_scripts() -> None:
    """`benchmarks/run_all.py  # the whole suite ...; --quick to check it runs, --only NAME...`: options the comment
    beside a command names are options of the script it runs."""
    checked = 0
    for where, _, line in _shell_lines():
        found = [_script_path(words) for words in _simple_commands(line)]
        if "#" not in line or not any(found):
            continue
        [(script, _)] = [f for f in found if f]
        for option in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", line.split("#", 1)[1]):
            assert _has_option(_script_options(script), option), f"{where}: {script.name} has no option {option}"
            checked += 1
    assert checked >= 2


def test_the_mpirun_line_is_what_launcher_mpi_runs() -> None:
    """"`run` calls `mpirun -np N -H a:2,b:1 --map-by slot --bind-to none ...`": up to its "...", the line
    launcher=mpi builds for the hosts and slots its -H gives, one rank per process."""
    section = " ".join(docs().section("Launchers").split())
    shown = re.search(r"`run` calls `(mpirun -np N -H ([\w:,]+) [^`]*) \.\.\.`", section)
    assert shown is not None
    hosts = [{"name": name, "devices": int(slots)} for name, slots in (h.split(":") for h in shown[2].split(","))]
    world = sum(h["devices"] for h in hosts)
    paths = RunPaths(Path("/runs/R1"), "R1")
    got = validate(("launcher=mpi", "launcher.tasks=per_device", "device=cpu", f"recipe.global_batch_size={world}",
                    *hosts_override(*hosts)))
    assert got.valid, got.rendered()
    job = pinned(got.job, MpiLauncher.pins(got.job, paths))
    launcher = MpiLauncher(plan=plan_for(job, paths), paths=paths, environment=environment(),
                           invocation=Invocation(python="/venv/bin/python", cwd="/work/proj"))
    [command] = launcher.request().commands
    words = shown[1].replace("-np N", f"-np {world}").split()
    assert list(command.argv[:len(words)]) == words, command.argv


def test_the_invalid_spec_shown_is_what_validation_says() -> None:
    """The dry run's example of an invalid spec is what `run topology=hetero_2_1 recipe.global_batch_size=2` (2+1
    processes, launcher=local) prints, every problem at once."""
    section = docs().section("The dry run")
    [shown] = [b for b in docs().blocks if b.section == "The dry run" and b.lines[0].startswith("error:")]
    assert "every problem at once" in section and "`run topology=hetero_2_1 recipe.global_batch_size=2`" in section
    job, problems = check(compose("topology=hetero_2_1", "recipe.global_batch_size=2"), FixedProbe())
    assert job is None and render_problems(problems) == "\n".join(shown.lines)


def test_a_target_that_does_not_import_is_refused_as_shown(tmp_path) -> None:
    """"Checked before launch, the way the ranks do it": the error shown, for its module in a folder of the user's."""
    [shown] = [b for b in docs().blocks if b.lines[0].startswith("error: recipe.target: importing")]
    module, missing, line = re.search(r"importing '([\w.]+)' raised ModuleNotFoundError: No module named '(\w+)' at "
                                      r"/home/me/repo/[\w/]+\.py:(\d+)", shown.lines[0]).groups()
    package = tmp_path / module.split(".")[0]
    package.mkdir()
    (package / "__init__.py").write_text("")
    (tmp_path / f"{module.replace('.', '/')}.py").write_text("import os\n" * (int(line) - 1) + f"import {missing}\n")
    spec = compose("recipe=custom", f"recipe.target={module}", f"workdir={tmp_path}")
    job, problems = check(spec, FixedProbe(dirs=frozenset({str(tmp_path)})))
    assert job is None and render_problems(problems) == "\n".join(shown.lines).replace("/home/me/repo", str(tmp_path))
