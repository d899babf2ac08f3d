"""Running the real `run` command in a test, and checking what it leaves behind.

* :func:`user_env`: the environment of every command a test starts, a user's shell; :func:`stage_workloads` puts the
  tests' recipes in the folder `run` starts in.
* :func:`started` (any command) and :func:`running` (`run`): the one way a test starts a process, in a ``with``
  block that always reaps it; :meth:`Started.wait` or :func:`finish` give how it ended, and one that does not end in
  time is asked where its ranks are (SIGQUIT) before it is killed. :func:`run` is `run`, waited for.
* :func:`wait_until`: the one way a test waits for something.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

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


# ------------------------------------------------------------------------------ the user's shell

# What a user's shell does not have when they type `run`: another job's scheduler and launcher variables (Slurm's,
# Open MPI's, PMI's, Hydra's, torchrun's), and a PYTHONPATH to this checkout (the runner must find a user's modules
# from the folder `run` starts in, as it does for them).
FOREIGN_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "HYDRA_", "TORCHELASTIC_", "PYTEST_")  # (PYTEST_ADDOPTS:
# the suite's own options, which a user's pytest, run by a test, does not know)
FOREIGN_NAMES = frozenset({"PYTHONPATH", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                           "MASTER_ADDR", "MASTER_PORT"})


# The suite's jobs share this machine's cores: the bed's hosts are network namespaces of one machine, and the workers
# run several jobs at once. A rank left to the runner's default threads (its host's cores over its processes: all of
# them for one process a host, as torch's own default) runs a thread per core, and OpenMP's idle threads spin for
# cores the other jobs' processes wait for: the ranks of a 2-host digits job on the bed (test_job_across_hosts.py's
# restart) took 24 CPU-s that way, 11 with a thread each; 45 and 8 beside two busy loops. So the shell the tests
# start `run` from says what a user who shares a machine's cores says, and the bed's sshd sets the same for its logins
# (scripts/bed/sshd.py); the tests of the default itself start `run` without it (``shared_cores=False``).
SHARED_CORES = {"OMP_NUM_THREADS": "1"}


def user_env(extra: Mapping[str, str] | None = None, *, shared_cores: bool = True) -> dict[str, str]:
    """This process's environment as a user's shell has it when they type `run` (none of :data:`FOREIGN_PREFIXES`
    and :data:`FOREIGN_NAMES`; :data:`SHARED_CORES`, or with ``shared_cores=False`` no OMP_NUM_THREADS at all: the
    runner's default), plus ``extra`` (a bed's SLURM_CONF, a test's own variables)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(FOREIGN_PREFIXES) and k not in FOREIGN_NAMES and k not in SHARED_CORES}
    if shared_cores:
        env.update(SHARED_CORES)
    env.update(extra or {})
    return env


def stage_workloads(cwd: Path) -> Path:
    """Make ``cwd`` a user's folder that holds the tests' recipes (the ``workloads`` package), as a user's repository
    holds theirs: the runner must find them as it finds a user's modules. ``cwd``."""
    staged = cwd / "workloads"
    if not staged.exists():
        shutil.copytree(TESTS / "workloads", staged, ignore=shutil.ignore_patterns("__pycache__"))
    return cwd


# ------------------------------------------------------------------------------ waiting


def wait_until(predicate: Callable[[], object], timeout: float, what: str,
               alive: Sequence[Started | subprocess.Popen] = ()) -> None:
    """Return once ``predicate()`` is true; fail naming ``what`` after ``timeout`` seconds, or as soon as one of
    ``alive`` (processes that must still run meanwhile) has ended, with its output. The one place a test polls."""
    deadline, pause = time.monotonic() + timeout, 0.005  # asked again soon at first (most waits are short), then
    while not predicate():  # every 50 ms at most
        ended = [p for p in alive if p.poll() is not None]
        if ended:
            p = ended[0]
            said = p.ended_tail() if isinstance(p, Started) else (p.communicate()[0] or "")[-TAIL:]
            raise AssertionError(f"ended (exit {p.returncode}) before {what}:\n{said}")
        if time.monotonic() >= deadline:
            raise AssertionError(f"not {what} within {timeout:g} s")
        time.sleep(pause)
        pause = min(2 * pause, 0.05)


# ------------------------------------------------------------------------------ starting `run` (or any command)

TAIL = 4000  # characters of each stream a failure shows
QUIT_SAID = "    (stacks: logs/rank*.log; "  # the last line of `run`'s answer to SIGQUIT (runner/reports/where.py)
QUIT_WAIT_S = 20.0  # where.py waits 3 s for the ranks' dumps; across hosts and schedulers the answer takes longer
READERS_WAIT_S = 30.0  # after the end, for what is left in its pipes


class Started:
    """A command started by :func:`started` (`run`, or `run` in a namespace host, or any other): its output read as
    it comes, by a thread per stream (no full pipe stops it while a test waits for a marker), and always reaped when
    the ``with`` block ends. :meth:`wait` gives its :class:`Finished`; one that does not end in time is asked where
    its ranks are (SIGQUIT: runner/reports/where.py), then killed, and the failure shows the tail of its output."""

    def __init__(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None = None, run_id: str = "",
                 merged: bool = False, newline: str | None = None) -> None:
        self.argv, self.run_id = list(argv), run_id
        self.proc = subprocess.Popen(self.argv, cwd=cwd, env=user_env() if env is None else dict(env),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merged else subprocess.PIPE)
        self._lines: dict[str, list[str]] = {"stdout": [], "stderr": []}
        pipes = {"stdout": self.proc.stdout} if merged else {"stdout": self.proc.stdout, "stderr": self.proc.stderr}
        self._readers = [threading.Thread(target=self._read, args=(pipe, self._lines[name], newline), daemon=True,
                                          name=f"{name} of {Path(self.argv[0]).name} {self.proc.pid}")
                         for name, pipe in pipes.items()]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(pipe: IO[bytes], into: list[str], newline: str | None) -> None:
        # newline=None: as text=True reads (\r\n and \r become \n); "": as written
        with io.TextIOWrapper(pipe, encoding="utf-8", errors="replace", newline=newline) as text:
            for line in text:
                into.append(line)

    def __enter__(self) -> Started:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, _tb: object) -> None:
        if error is not None and self.poll() is None:  # the test failed while it ran: say where it was
            error.add_note(stop_and_explain([self], "it was still running"))
        self.reap()

    # -- the process
    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def poll(self) -> int | None:
        return self.proc.poll()

    def send_signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def reap(self) -> None:
        """Kill it if it still runs, and wait for it (nothing of it is left running or a zombie)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for reader in self._readers:
            reader.join(timeout=5)

    # -- its output
    @property
    def stdout(self) -> str:
        return "".join(self._lines["stdout"])

    @property
    def stderr(self) -> str:
        return "".join(self._lines["stderr"])

    def said(self, text: str) -> bool:
        """Whether a line it wrote so far (either stream) holds ``text``."""
        return any(text in line for lines in self._lines.values() for line in list(lines))

    def tail(self) -> str:
        """The last :data:`TAIL` characters of each stream, as a failure shows them."""
        shown = [f"--- {' '.join(self.argv)[:300]} (pid {self.pid}, exit {self.proc.returncode})"]
        for name, lines in self._lines.items():
            if lines or name == "stdout":
                shown.append(f"--- {name}, the last {TAIL} characters:\n{''.join(lines)[-TAIL:]}")
        return "\n".join(shown)

    def ended_tail(self) -> str:
        """:meth:`tail` once it has ended, its pipes read to the end."""
        self._join_readers()
        return self.tail()

    def _join_readers(self) -> None:
        for reader in self._readers:
            reader.join(timeout=READERS_WAIT_S)
        if any(reader.is_alive() for reader in self._readers):
            raise AssertionError(f"it ended, but {READERS_WAIT_S:g} s later something it started still holds its "
                                 f"output open:\n{self.tail()}")

    def wait(self, timeout: float) -> Finished:
        """Wait for its end: its exit status and output. Not ended within ``timeout`` s: an AssertionError that says
        where its ranks were (:func:`stop_and_explain`)."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(stop_and_explain([self], f"not ended within {timeout:g} s")) from None
        self._join_readers()
        return Finished(self.proc.returncode, self.stdout, self.stderr, self.run_id)


def started(argv: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None = None, run_id: str = "",
            merged: bool = False, newline: str | None = None) -> Started:
    """Start ``argv`` in ``cwd`` with ``env`` (default: :func:`user_env`); use it as ``with started(...) as proc``.
    ``merged``: stderr into stdout (one stream, in the order written); ``newline=""``: its output untranslated (carriage
    returns kept)."""
    return Started(argv, cwd=cwd, env=env, run_id=run_id, merged=merged, newline=newline)


def stop_and_explain(procs: Sequence[Started], why: str) -> str:
    """Ask those of ``procs`` still running where their ranks are (SIGQUIT: `run` prints where every rank is), wait
    for that answer (or their end) for :data:`QUIT_WAIT_S`, kill them, and say ``why`` with the tail of every one's
    output."""
    running = [p for p in procs if p.poll() is None]
    for p in running:
        p.send_signal(signal.SIGQUIT)
    try:
        wait_until(lambda: all(p.poll() is not None or p.said(QUIT_SAID) for p in running), QUIT_WAIT_S,
                   "answered SIGQUIT")
        answered = "asked where its ranks are (SIGQUIT), then killed"
    except AssertionError:
        answered = f"asked where its ranks are (SIGQUIT; no answer within {QUIT_WAIT_S:g} s), then killed"
    for p in running:
        p.reap()
    return f"{why}: {answered}:\n" + "\n".join(p.tail() for p in procs)


def finish(procs: Sequence[Started], timeout: float = 120) -> list[tuple[int, str]]:
    """Wait for all of ``procs`` (started ``merged``), together within ``timeout``: each one's exit status and output.
    Not all ended in time: an AssertionError that says where the ranks of each were (:func:`stop_and_explain`)."""
    try:
        wait_until(lambda: all(p.poll() is not None for p in procs), timeout, "all done")
    except AssertionError:
        raise AssertionError(stop_and_explain(procs, f"not all done within {timeout:g} s")) from None
    return [(done.code, done.output) for done in (p.wait(READERS_WAIT_S) for p in procs)]


def run_args(overrides: Sequence[str], run_id: str) -> list[str]:
    """`run OVERRIDES`, with ``run_id=...`` before a ``--`` unless one is there."""
    args = list(overrides)
    if not any(o.startswith("run_id=") for o in overrides):
        args.insert(args.index("--") if "--" in args else len(args), f"run_id={run_id}")
    return [RUN, *args]


def running(*overrides: str, cwd: Path, run_id: str | None = None, env: Mapping[str, str] | None = None,
            prefix: Sequence[str] = (), workloads: bool = True, merged: bool = False, newline: str | None = None,
            ) -> Started:
    """`run` with these arguments, :func:`started` in ``cwd``, which holds the tests' workloads
    (:func:`stage_workloads`; not with ``workloads=False``), with a unique run id (before a ``--``) unless one is
    among them. ``env``: default :func:`user_env`; ``prefix``: a command that starts `run` (salloc ...)."""
    given = next((o.split("=", 1)[1] for o in overrides if o.startswith("run_id=")), None)
    run_id = given or run_id or f"t{uuid.uuid4().hex[:10]}"
    if workloads:
        stage_workloads(cwd)
    return started([*prefix, *run_args(overrides, run_id)], cwd=cwd, env=env, run_id=run_id, merged=merged,
                   newline=newline)


def run(*overrides: str, cwd: Path, timeout: float = 180, **how) -> Finished:
    """`run` with these arguments (:func:`running`, ``how`` its options), waited for."""
    with running(*overrides, cwd=cwd, **how) as proc:
        return proc.wait(timeout)


def signal_when_ready(args: list[str], cwd: Path, sig: int, ready: str, count: int = 1, timeout: float = 60,
                      env: Mapping[str, str] | None = None) -> Finished:
    """Start `run` with ``args`` (one of them ``run_id=...``); once ``count`` files under ``cwd`` match the
    glob ``ready``, send it ``sig``, and wait for it to end."""
    with running(*args, cwd=cwd, env=env) as proc:
        wait_until(lambda: len(list(cwd.glob(ready))) >= count, timeout, f"{count} file(s) {ready} under {cwd}",
                   alive=[proc])
        proc.send_signal(sig)
        return proc.wait(120)


def wait_for_pids(proc: Started, folder: Path, ranks: int, timeout: float = 60) -> dict[int, int]:
    """Wait until each of ``ranks`` ranks of ``proc`` has written its pid to ``folder/pid<rank>`` (as
    workloads.failing does, once in its recipe): the pids by rank."""
    def written() -> dict[int, int]:
        found = {int(f.name[3:]): f.read_text().strip() for f in folder.glob("pid*")}
        return {r: int(pid) for r, pid in found.items() if pid}  # written, not just created

    wait_until(lambda: len(written()) >= ranks, timeout, f"{ranks} rank(s) in their recipe", alive=[proc])
    return written()


def processes_of(run_id: str) -> list[psutil.Process]:
    """Live processes of a run: ranks carry TORCHELASTIC_RUN_ID; `run` and its launch agent carry
    `run_id=<id>` on their command line (the tests always pass one); launcher=ssh's ssh clients and each host's
    `run --ssh-host <i> <run folder>` end with the run's folder, ``.../runs/<id>``; mpirun, srun and the tasks they
    start end with its spec, ``.../runs/<id>/spec.yaml``, and the tasks of a Slurm job's rounds name their round's,
    ``.../runs/<id>/spec.round<N>.yaml``."""
    found = []
    for p in psutil.process_iter():
        try:
            cmdline = p.cmdline()
            mine = (p.environ().get("TORCHELASTIC_RUN_ID") == run_id or f"run_id={run_id}" in cmdline
                    or bool(cmdline) and cmdline[-1].endswith((f"/runs/{run_id}", f"/runs/{run_id}/spec.yaml"))
                    or any(f"/runs/{run_id}/spec.round" in part for part in cmdline))
            if mine and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


LEFT_S = 10.0  # after `run` ends: a rank killed in its last moment is on its way out until init has reaped it


def nothing_left(run_id: str, within_s: float = LEFT_S) -> None:
    """No process of the run is left (:func:`processes_of`) ``within_s`` of the moment this is called: `run` ends
    what it started before it exits, but a process it killed last may not have been reaped yet (its parent, a zygote
    killed with it, hands it to init)."""
    wait_until(lambda: not processes_of(run_id), within_s, f"nothing of run {run_id} left")


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


@contextmanager
def manual_hosts(testbed, cwd: Path, args: Sequence[str], run_id: str, script: Sequence[str] = (),
                 workloads: bool = True) -> Iterator[list[Started]]:
    """`run ARGS launcher.manual.host=i run_id=... [-- SCRIPT...]` inside each host's namespace, all at once, in
    ``cwd`` (which holds the tests' workloads: :func:`stage_workloads`; not with ``workloads=False``), each
    :func:`started` with its output merged; all reaped at the end of the ``with`` block."""
    if workloads:
        stage_workloads(cwd)
    tail = ("--", *script) if script else ()
    with ExitStack() as stack:
        yield [stack.enter_context(started(testbed.exec_argv(h, [RUN, *args, f"launcher.manual.host={i}",
                                                                 f"run_id={run_id}", *tail]),
                                           cwd=cwd, env=testbed.env(), run_id=run_id, merged=True))
               for i, h in enumerate(testbed.hosts)]


def on_each_host(testbed, cwd: Path, args: Sequence[str], run_id: str, timeout: float = 120,
                 script: Sequence[str] = (), workloads: bool = True) -> list[tuple[int, str]]:
    """:func:`manual_hosts`, waited for (:func:`finish`): each host's exit status and output."""
    with manual_hosts(testbed, cwd, args, run_id, script=script, workloads=workloads) as hosts:
        return finish(hosts, timeout)


# --------------------------------------------------------------------------- what docs/ quotes of a test's output


class _AnyName(dict):
    """Placeholders of :func:`seen_in` the caller did not give: any name or address."""

    def __missing__(self, key: str) -> str:
        return r"[\w.:-]+"


def seen_in(said: dict[str, str], key: str, testbed=None, **names: str) -> str:
    """The pattern ``said[key]``, written with ``{host0}`` and ``{host1}`` (and any other ``{name}``: ``names``), for
    the test bed's hosts (any host name without one)."""
    values = _AnyName({f"host{i}": re.escape(h.name) for i, h in enumerate(testbed.hosts)} if testbed else {})
    values.update({k: re.escape(v) for k, v in names.items()})
    return said[key].format_map(values)


def check_readme_quotes(heading: str, said: dict[str, str], test_file: str) -> None:
    """The page of docs/ that has the section ``heading`` shows real output of ``test_file``'s tests: each pattern of
    ``said`` (what they assert) matches one of its quoted blocks, and the page names the file."""
    from readme_text import docs

    page = docs().page_with(heading)
    quoted = "\n".join(block for n, block in enumerate(page.text.split("```")) if n % 2)
    for key in said:
        assert re.search(seen_in(said, key), quoted), \
            f"{page.name}'s quote of {key!r} is not what the tests see: {said[key]}"
    assert test_file in page.text
