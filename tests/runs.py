"""Running the real `run` command in a test, and checking what it leaves behind."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil
from omegaconf import OmegaConf

RUN = str(Path(sys.executable).parent / "run")
TESTS = Path(__file__).parent


@dataclass
class Finished:
    code: int
    stdout: str
    stderr: str
    run_id: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def plain_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this environment) as a user's shell has it: no PYTHONPATH pointing at anything."""
    return {k: v for k, v in (os.environ if base is None else base).items() if k != "PYTHONPATH"}


def user_env(cwd: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """Make ``cwd`` a user's folder that holds the tests' recipes (the ``workloads`` package), as a user's
    repository holds theirs, and return :func:`plain_env`: the runner must find them as it finds a user's
    modules, from the folder `run` is started in."""
    staged = cwd / "workloads"
    if not staged.exists():
        shutil.copytree(TESTS / "workloads", staged, ignore=shutil.ignore_patterns("__pycache__"))
    return plain_env(base)


def run(*overrides: str, cwd: Path, timeout: float = 180, run_id: str | None = None,
        env: dict[str, str] | None = None, prefix: tuple[str, ...] = (), workloads: bool = True) -> Finished:
    """`run` with these arguments in ``cwd``, which holds the tests' workloads (:func:`user_env`; not with
    ``workloads=False``), and a unique run id (before a ``--``). ``env``: the environment (default: this
    one), without PYTHONPATH; ``prefix``: a command that starts `run` (salloc ...)."""
    run_id = run_id or f"t{uuid.uuid4().hex[:10]}"
    env = user_env(cwd, env) if workloads else plain_env(env)
    args = [*prefix, RUN, *overrides]
    if not any(o.startswith("run_id=") for o in overrides):
        args.insert(args.index("--") if "--" in args else len(args), f"run_id={run_id}")
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return Finished(proc.returncode, proc.stdout, proc.stderr, run_id)


def signal_when_ready(args: list[str], cwd: Path, sig: int, ready: str, count: int = 1, timeout: float = 60,
                      env: dict[str, str] | None = None) -> Finished:
    """Start `run` with ``args`` (one of them ``run_id=...``); once ``count`` files under ``cwd`` match the
    glob ``ready``, send it ``sig``, and wait for it to end."""
    run_id = next(a.split("=", 1)[1] for a in args if a.startswith("run_id="))
    proc = subprocess.Popen([RUN, *args], cwd=cwd, env=user_env(cwd, env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + timeout
        while len(list(cwd.glob(ready))) < count:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return Finished(proc.returncode, out, err, run_id)


def wait_until(predicate, timeout: float, what: str, alive: list[subprocess.Popen] = ()) -> None:
    """Return once ``predicate()`` is true; fail naming ``what`` after ``timeout`` seconds, or as soon as one of
    ``alive`` (processes that must still run meanwhile) has ended, with its output."""
    deadline = time.monotonic() + timeout
    while not predicate():
        ended = [p for p in alive if p.poll() is not None]
        if ended:
            out = ended[0].communicate()[0] or ""
            raise AssertionError(f"ended (exit {ended[0].returncode}) before {what}:\n{out[-4000:]}")
        if time.monotonic() >= deadline:
            raise AssertionError(f"not {what} within {timeout:g} s")
        time.sleep(0.05)


def processes_of(run_id: str) -> list[psutil.Process]:
    """Live processes of a run: ranks carry TORCHELASTIC_RUN_ID; `run` and its launch agent carry
    `run_id=<id>` on their command line (the tests always pass one); launcher=ssh's ssh clients and each host's
    `run --ssh-host <i> <run folder>` end with the run's folder, ``.../runs/<id>``."""
    found = []
    for p in psutil.process_iter():
        try:
            cmdline = p.cmdline()
            mine = (p.environ().get("TORCHELASTIC_RUN_ID") == run_id or f"run_id={run_id}" in cmdline
                    or bool(cmdline) and cmdline[-1].endswith(f"/runs/{run_id}"))
            if mine and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def artifacts(folder: Path) -> dict[int, dict]:
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in folder.glob("rank*.json")}


# a copy of the tests' workloads in the run folder, imported from there (code_dir), in a folder that is no git repository
SNAPSHOT = ("launcher.snapshot_code=true", "launcher.snapshot_files=['workloads/*.py']")


def check_views(art: Path, spec_file: Path, world: int) -> dict[int, dict]:
    """Every rank of the run saw one job (workloads.view): the same run id, master address and port, recipe options,
    code and folder, and a spec equal to the run's spec.yaml (save launcher.manual.host, which says which host a
    manual `run` is); the run id is the spec's, the options are its recipe, the code comes from its code_dir (else
    its workdir), and a master port it pins is the one the ranks met."""
    views = {int(p.stem[4:]): json.loads(p.read_text()) for p in art.glob("view*.json")}
    assert sorted(views) == list(range(world)), sorted(views)
    written = OmegaConf.to_container(OmegaConf.load(spec_file))
    for spec in (written, *(v["spec"] for v in views.values())):
        spec["launcher"]["manual"]["host"] = None
    shared = ("run_id", "master_addr", "master_port", "options", "code", "cwd", "spec")
    seen = {k: views[0][k] for k in shared}
    for rank, view in views.items():
        assert {k: view[k] for k in shared} == seen, (rank, view, seen)
    assert seen["spec"] == written, (seen["spec"], written)
    assert seen["run_id"] == written["run_id"] and seen["options"] == written["recipe"]
    assert seen["code"] == (written["code_dir"] or written["workdir"]) and seen["cwd"] == written["workdir"]
    if written["init"]["master_port"]:
        assert seen["master_port"] == str(written["init"]["master_port"]), seen
    return views


def run_folder(cwd: Path) -> Path:
    """The single run folder a `run` made under cwd/outputs."""
    (folder,) = [p.parent for p in (cwd / "outputs").glob("*/*/spec.yaml")]
    return folder


# --------------------------------------------------------------------------- several hosts (the test bed)


def bed_hosts(testbed, counts: list[int]) -> tuple[str, ...]:
    """Overrides that make the topology the bed's hosts, with ``counts`` processes each."""
    from conftest import hosts_override

    return hosts_override(*({"name": h.name, "devices": n} for h, n in zip(testbed.hosts, counts)))


def mpi_options(testbed) -> list[str]:
    """launcher=mpi, with what mpirun needs to reach the bed's namespace hosts."""
    extra = ",".join(f"'{a}'" for a in testbed.mpirun_args)
    return ["launcher=mpi", f"launcher.mpi.extra=[{extra}]"]


def start_manual_hosts(testbed, cwd: Path, args: list[str], run_id: str, env: dict[str, str] | None = None,
                       script: tuple[str, ...] = ()) -> list[subprocess.Popen]:
    """`run ARGS launcher.manual.host=i run_id=... [-- SCRIPT...]` inside each host's namespace, all at once,
    in ``cwd`` (``env``: default the tests' workloads staged in ``cwd``, :func:`user_env`)."""
    env = user_env(cwd, testbed.env()) if env is None else env
    tail = ("--", *script) if script else ()
    return [subprocess.Popen(testbed.exec_argv(h, [RUN, *args, f"launcher.manual.host={i}", f"run_id={run_id}", *tail]),
                             cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for i, h in enumerate(testbed.hosts)]


def finish(procs: list[subprocess.Popen], timeout: float = 120) -> list[tuple[int, str]]:
    """Each process's exit status and output; none is left running."""
    deadline = time.monotonic() + timeout
    results = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            results.append((p.returncode, out))
    except subprocess.TimeoutExpired:
        said = []
        for i, p in enumerate(procs):
            if p.poll() is None:
                p.kill()
            out, _ = p.communicate()
            said.append(f"--- process {i} (exit {p.returncode}):\n{(out or '')[-4000:]}")
        raise AssertionError(f"not done within {timeout:g} s:\n" + "\n".join(said)) from None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


# --------------------------------------------------------------------------- what the README quotes of a test's output


def seen_in(said: dict[str, str], key: str, testbed=None) -> str:
    """The pattern ``said[key]``, written with ``{host0}`` and ``{host1}``, for the test bed's hosts (any host name
    without one)."""
    names = [re.escape(h.name) for h in testbed.hosts] if testbed is not None else [r"\w+", r"\w+"]
    return said[key].format(host0=names[0], host1=names[1])


def check_readme_quotes(heading: str, said: dict[str, str], test_file: str) -> None:
    """README's section ``heading`` shows real output of ``test_file``'s tests: each pattern of ``said`` (what they
    assert) matches one of its quoted blocks, and the section names the file."""
    readme = (TESTS.parent / "README.md").read_text()
    section = readme[readme.index(heading):]
    section = section[:section.index("\n## ", 1)]
    quoted = "\n".join(block for n, block in enumerate(section.split("```")) if n % 2)
    for key in said:
        assert re.search(seen_in(said, key), quoted), f"README's quote of {key!r} is not what the tests see: {said[key]}"
    assert test_file in section
