"""torchrun and `run`, side by side: the same unchanged scripts run by ``torchrun --standalone --nproc_per_node=2``
(it ships with torch) and by ``run topology=1x2 -- ...`` from the same folder, with a user's environment, and what
each script saw compared. Every difference kept on purpose is a row of docs/torchrun.md's "Differences from torchrun"
table, and the suite asserts exactly those."""

from __future__ import annotations

import json
import re
import shutil
import signal
import sys
import time
import uuid
from pathlib import Path

import pytest

from runner.environments.process import usable_cpus
from readme_text import docs
from runs import RUN, TESTS, Finished, nothing_left, started, user_env, wait_until

TORCHRUN = str(Path(sys.executable).parent / "torchrun")
SCRIPTS = TESTS / "scripts"
NATURE = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE"}  # per run by nature: a port, an id, a path


def readme_differences() -> dict[str, tuple[str, str]]:
    """The table of differences from torchrun (docs/torchrun.md): first cell -> (torchrun's cell, run's cell)."""
    section = docs().section("Differences from torchrun")
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 4 and not set(cells[0]) <= {"-"} and cells[0] != "what":
            rows[cells[0]] = (cells[1], cells[2])
    return rows


def readme_variables() -> dict[str, tuple[str, str]]:
    """The rows of the table that are environment variables: name -> (torchrun's value, run's value)."""
    return {m.group(1): cells for key, cells in readme_differences().items()
            if (m := re.fullmatch(r"`([A-Z][A-Z0-9_]*)`", key))}


def launcher_argv(launcher: str, args: list[str], run_id: str) -> list[str]:
    """The script ``args`` on 2 processes of this machine, by torchrun or by `run`, as a user would type it."""
    if launcher == "torchrun":
        return [TORCHRUN, "--standalone", "--nproc_per_node=2", *args]
    return [RUN, "topology=1x2", f"run_id={run_id}", "--", *args]


def launcher_env(launcher: str, cwd: Path) -> dict[str, str]:
    """The user's environment with each launcher's own threads (no OMP_NUM_THREADS: what each sets is compared), and
    torchrun's temporary folder in ``cwd``: its agent leaves its folder (torchelastic_*) behind, and the test's folder
    is removed with it."""
    extra = {}
    if launcher == "torchrun":
        (cwd / "torchrun-tmp").mkdir(exist_ok=True)
        extra["TMPDIR"] = str(cwd / "torchrun-tmp")
    return user_env(extra, shared_cores=False)


def launch(launcher: str, args: list[str], cwd: Path, prefix: tuple[str, ...] = (), timeout: float = 120) -> Finished:
    """Run the script ``args`` on 2 processes of this machine by ``launcher`` (:func:`launcher_argv`)."""
    run_id = f"p{uuid.uuid4().hex[:8]}"
    with started([*prefix, *launcher_argv(launcher, args, run_id)], cwd=cwd, env=launcher_env(launcher, cwd),
                 run_id=run_id) as proc:
        done = proc.wait(timeout)
    nothing_left(run_id)  # nothing of a `run` is left behind, whatever the script did
    return done


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A user's folder with the probe scripts, and a package whose module runs as `python -m` runs it."""
    cwd = tmp_path_factory.mktemp("parity")
    for name in ("parity_probe.py", "parity_exit.py", "parity_trap.py"):
        shutil.copy(SCRIPTS / name, cwd)
    (cwd / "pkg").mkdir()
    (cwd / "pkg" / "__init__.py").write_text("")
    shutil.copy(SCRIPTS / "parity_probe.py", cwd / "pkg" / "train.py")
    return cwd


def probed(folder: Path, launcher: str, script: list[str], tag: str, prefix: tuple[str, ...] = ()):
    out = folder / f"{tag}-{launcher}"
    out.mkdir()
    done = launch(launcher, [*script, str(out)], folder, prefix)
    assert done.code == 0, done.output
    return done, {r: json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)}


@pytest.fixture(scope="module")
def both(folder):
    """The probe under each launcher: (what it printed, what each rank saw)."""
    return {launcher: probed(folder, launcher, ["parity_probe.py"], "probe") for launcher in ("torchrun", "run")}


def test_the_environment_differs_from_torchruns_only_as_the_readme_says(both):
    documented = readme_variables()
    nature_row = next(k for k in readme_differences() if "`MASTER_PORT`" in k)
    assert set(re.findall(r"`([A-Z_]+)`", nature_row)) == NATURE
    # OMP_NUM_THREADS: torchrun's 1 for several processes per host; ours their share of this process's CPUs,
    # which is 1 too where 2 processes share 2 CPUs (then it is no difference here)
    share = str(max(1, usable_cpus() // 2))
    expected = set(documented) - ({"OMP_NUM_THREADS"} if share == "1" else set())
    for rank in (0, 1):
        theirs, ours = both["torchrun"][1][rank]["env"], both["run"][1][rank]["env"]
        differing = {k for k in theirs.keys() | ours.keys() if theirs.get(k) != ours.get(k)} - NATURE - {"_"}
        assert differing == expected, (differing, expected)
        assert (theirs["OMP_NUM_THREADS"], ours["OMP_NUM_THREADS"]) == ("1", share)
        assert NATURE <= theirs.keys() & ours.keys()
        for name, cells in documented.items():  # each literal value, or "not set", as the table says
            for env, cell in zip((theirs, ours), cells):
                if cell == "not set":
                    assert name not in env, (name, env.get(name))
                elif re.fullmatch(r"`[^`]*`", cell):
                    assert env.get(name) == cell.strip("`"), (name, env.get(name), cell)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                 "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                 "TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING"):
        assert both["run"][1][1]["env"][name] == both["torchrun"][1][1]["env"][name], name


def test_the_script_sees_the_same_process(both, folder):
    """argv, the command line, its folder and path, ``__main__``, every attribute of its streams (real files,
    ``python -u``'s), faulthandler and its thread count: as under torchrun."""
    for rank in (0, 1):
        theirs, ours = both["torchrun"][1][rank], both["run"][1][rank]
        for seen in (theirs, ours):  # the probe's own output folder differs, and only it
            seen["argv"][-1] = seen["orig_argv"][-1] = Path(seen["argv"][-1]).name.split("-")[0]
        for key in ("argv", "orig_argv", "cwd", "path0", "main_file", "name", "stdout", "stderr", "faulthandler",
                    "threads"):
            assert ours[key] == theirs[key], (key, ours[key], theirs[key])
        assert ours["argv"] == ["parity_probe.py", "probe"] and ours["main_file"] == str(folder / "parity_probe.py")
        assert ours["stdout"]["fileno"] == 1 and ours["stderr"]["fileno"] == 2 and ours["faulthandler"]
        assert theirs["thread_names"] == ["MainThread"]
        assert ours["thread_names"] == ["MainThread", "runner-watch"]  # docs/torchrun.md: the threads of a rank


def test_a_rank_is_a_fresh_process_as_a_torchrun_worker_is(both):
    """Side by side: each rank draws its own random numbers (torch's seed, torch's, numpy's and Python's global
    generators), and starts with what a fresh interpreter that imported torch has: no thread-local torch state, mode
    or hook, no atexit function, logging handler or warning filter of a parent's, the interpreter's flags, CUDA not
    initialised, torch._dynamo not imported (a rank forked after it was hung at its end)."""
    for launcher in ("torchrun", "run"):
        draws = [both[launcher][1][rank]["draws"] for rank in (0, 1)]
        assert all(a != b for a, b in zip(*draws)), (launcher, draws)
    # docs/torchrun.md's table: a str's hash() is every torchrun worker's own, and the same in every rank of a host under `run`
    assert "`hash()` of a `str` (unless `PYTHONHASHSEED` is set)" in readme_differences()
    hashes = {launcher: {both[launcher][1][rank]["str_hash"] for rank in (0, 1)} for launcher in ("torchrun", "run")}
    assert len(hashes["torchrun"]) == 2 and len(hashes["run"]) == 1, hashes
    # docs/torchrun.md's table: beyond 0, 1 and 2, the rank's event pipe to its agent and its client of the job's channel
    assert "open descriptors beyond 0, 1, 2 at the first line" in readme_differences()
    for rank in (0, 1):
        assert both["torchrun"][1][rank]["descriptors"] == [] and both["run"][1][rank]["descriptors"] == [
            "pipe", "socket"], (both["torchrun"][1][rank]["descriptors"], both["run"][1][rank]["descriptors"])
    for rank in (0, 1):
        theirs, ours = both["torchrun"][1][rank]["state"], both["run"][1][rank]["state"]
        assert ours == theirs, {k: (ours[k], theirs[k]) for k in ours if ours[k] != theirs.get(k)}
        assert not ours["dynamo"] and not ours["cuda_initialized"]


def test_rank_0_reaches_the_terminal_stream_by_stream_as_under_torchrun(both):
    """stdout, stderr, warnings, logging, C-level writes and a child process's, of the host's first process, on
    `run`'s stdout and stderr as on torchrun's; the other ranks in their logs only (log.console=main)."""
    theirs, ours = both["torchrun"][0], both["run"][0]
    for kind, stream in (("stdout", "stdout"), ("c-stdout", "stdout"), ("child", "stdout"), ("stderr", "stderr"),
                         ("warning", "stderr"), ("logging", "stderr"), ("c-stderr", "stderr")):
        for rank in (0, 1):
            assert f"[{kind}] rank {rank}" in getattr(theirs, stream), (kind, rank)
        assert f"[{kind}] rank 0" in getattr(ours, stream), (kind, getattr(ours, stream))
        assert f"[{kind}] rank 1" not in ours.stdout + ours.stderr  # docs/torchrun.md: the terminal shows local rank 0


@pytest.mark.parametrize("how, code", [("return", 0), ("exit3", 1), ("os_exit0", 0), ("os_exit5", 1), ("raise", 1),
                                       ("segv", 1)])
def test_how_a_script_ends_is_how_the_launcher_ends(folder, how, code):
    """The exit status of each launcher for each way a script ends (a script that ends by os._exit is accounted
    for at once by its exit status: `run` waited forever for it before)."""
    theirs = launch("torchrun", ["parity_exit.py", how], folder)
    ours = launch("run", ["parity_exit.py", how], folder, timeout=60)
    assert theirs.code == code, theirs.stderr[-2000:]
    assert ours.code == code, ours.stderr[-2000:]
    if how == "raise":
        assert "ValueError: rank 1 gives up" in ours.stderr and 'File "' + str(folder / "parity_exit.py") in ours.stderr
        assert "runner/" not in ours.stderr.split("Traceback (most recent call last):")[1].split("ValueError")[0]
    if how == "segv":
        assert "rank 1 (host node0) failed first: killed by SIGSEGV" in ours.stderr


def _time_to_stop(launcher: str, folder: Path) -> tuple[float, int, str]:
    """Start the trapping script, SIGTERM the launcher once every rank is ready: seconds until the launcher
    exited, its status, its output."""
    marks = folder / f"trap-{launcher}"
    marks.mkdir()
    with started(launcher_argv(launcher, ["parity_trap.py", str(marks)], f"p{uuid.uuid4().hex[:8]}"), cwd=folder,
                 env=launcher_env(launcher, folder), merged=True) as proc:
        wait_until(lambda: all((marks / f"ready{r}").exists() for r in (0, 1)), 60, "every rank ready", alive=[proc])
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        done = proc.wait(60)
        took = time.monotonic() - sent
    assert all((marks / f"stopped{r}").exists() for r in (0, 1)), done.output  # each rank's own handler ran
    return took, done.code, done.output


def test_sigterm_reaches_a_script_that_traps_it_at_once(folder):
    theirs, theirs_code, _ = _time_to_stop("torchrun", folder)
    ours, ours_code, out = _time_to_stop("run", folder)
    assert ours <= theirs + 1.0, (ours, theirs)
    assert (theirs_code, ours_code) == (1, 143), out  # docs/torchrun.md: run exits 128 + the signal
    assert "where the ranks" not in out and "still running" not in out


def test_a_module_runs_as_python_m_runs_it(folder):
    seen = {launcher: probed(folder, launcher, ["-m", "pkg.train"], "module")[1] for launcher in ("torchrun", "run")}
    for rank in (0, 1):
        for key in ("argv", "orig_argv", "path0", "main_file", "name", "cwd"):
            theirs, ours = seen["torchrun"][rank][key], seen["run"][rank][key]
            if key in ("argv", "orig_argv"):
                theirs, ours = theirs[:-1], ours[:-1]  # the output folder
            assert ours == theirs, (key, ours, theirs)
    assert seen["run"][0]["argv"][0] == str(seen["run"][0]["cwd"]) + "/pkg/train.py"


def test_threads_follow_the_cpus_the_launcher_may_use(folder):
    """Under `taskset -c 0` (one CPU for two processes) each rank's torch runs one thread, under both."""
    seen = {launcher: probed(folder, launcher, ["parity_probe.py"], "taskset", ("taskset", "-c", "0"))[1]
            for launcher in ("torchrun", "run")}
    for rank in (0, 1):
        assert seen["run"][rank]["threads"] == seen["torchrun"][rank]["threads"] == 1
        assert seen["run"][rank]["env"]["OMP_NUM_THREADS"] == "1"
