"""runner.worker.rank_process and stdio: a rank as a process of its own, forked by a real zygote with real pipes and
a relay (no torch.distributed): its streams are `python -u`'s, its signals and random streams a fresh interpreter's,
its end its exit status, and nothing it started outlives it."""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from runner.common.signals import handling
from runner.worker.relay import Echo, OutputRelay, close_fds, pipes_for
from runner.worker.zygote import Zygote
from runs import wait_until

STREAM_FACTS = ("import sys, json; print(json.dumps([[getattr(s, 'encoding'), s.errors, s.line_buffering, "
                "s.write_through, s.name, s.mode, type(s.buffer).__name__, s.fileno()] for s in (sys.stdout, sys.stderr)]))")
BODIES = '''
def run(code, events):
    """Run ``code``; the process's exit status is what it leaves in ``status`` (0)."""
    scope = {"events": events}
    exec(code, scope)
    return scope.get("status", 0)
'''


@pytest.fixture(scope="module")
def zygote(tmp_path_factory):
    """One zygote for the module's ranks (an agent keeps one for all its attempts), started from a process that ignores
    SIGQUIT and SIGUSR1 (as the agent ignores SIGQUIT): what exec keeps, a rank must not."""
    folder = tmp_path_factory.mktemp("bodies")
    (folder / "rank_bodies.py").write_text(BODIES)
    with handling((signal.SIGQUIT, signal.SIGUSR1), signal.SIG_IGN):
        started = Zygote.start()
    started.folder = str(folder)
    yield started
    started.close()


def forked(zygote: Zygote, tmp_path: Path, code: str, echo: Echo = Echo()) -> tuple[int, str]:
    """Fork ``code`` as a rank from ``zygote``; wait for it; its exit status and its log."""
    relay = OutputRelay(*os.pipe()[1:], *os.pipe()[1:])  # a terminal nobody reads: the rank is not shown
    relay.start()
    log = tmp_path / f"rank{len(list(tmp_path.glob('rank*.log')))}.log"  # each rank its own
    pipes, fds = pipes_for(0, str(log), echo)
    try:
        rank = zygote.fork(0, fds, code, target="rank_bodies:run", workdir=zygote.folder)
    finally:
        close_fds(fds)
    relay.add(pipes)
    status = rank.reap(block=True)
    relay.drain(0)
    relay.close()
    return status, log.read_text()


def test_the_streams_are_those_python_u_makes(zygote, tmp_path):
    """What torchrun's worker (`python -u script.py`) has: FileIO buffers, write-through, the interpreter's
    encoding and error handlers, named <stdout>/<stderr>, on descriptors 1 and 2."""
    expected = subprocess.run([sys.executable, "-u", "-c", STREAM_FACTS], capture_output=True, text=True,
                              env={**os.environ, "PYTHONIOENCODING": ""}).stdout
    code, log = forked(zygote, tmp_path, STREAM_FACTS)
    assert code == 0 and json.loads(log) == json.loads(expected)


def test_signals_are_handled_as_in_a_fresh_interpreter(zygote, tmp_path):
    code, log = forked(zygote, tmp_path, (
        "import signal, json\n"
        "print(json.dumps({s.name: getattr(signal.getsignal(s), 'name', str(signal.getsignal(s))) for s in "
        "(signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGPIPE, signal.SIGQUIT)}))\n"
        "print(json.dumps(sorted(signal.pthread_sigmask(signal.SIG_BLOCK, []))))\n"))
    assert code == 0
    handlers, mask = map(json.loads, log.splitlines())
    assert handlers == {"SIGINT": str(signal.default_int_handler), "SIGTERM": "SIG_DFL", "SIGUSR1": "SIG_DFL",
                        "SIGPIPE": "SIG_IGN", "SIGQUIT": "SIG_DFL"}
    assert mask == []


def test_every_rank_draws_its_own_random_numbers_as_fresh_processes_do(zygote, tmp_path):
    """torch's and numpy's global generators are seeded from the OS in each rank, as in each fresh interpreter (a
    fork copied them: every rank drew the same), and Python's random differs too; a seed the code sets still rules."""
    draws = ("import json, random, numpy, torch\n"
             "print(json.dumps([torch.initial_seed(), torch.rand(2).tolist(), numpy.random.rand(2).tolist(), "
             "random.random()]))\n")
    seen = [json.loads(forked(zygote, tmp_path, draws)[1]) for _ in range(2)]
    assert all(a != b for a, b in zip(*seen)), seen
    seeded = "import json, torch\ntorch.manual_seed(3)\nprint(json.dumps(torch.rand(2).tolist()))\n"
    assert forked(zygote, tmp_path, seeded)[1] == forked(zygote, tmp_path, seeded)[1]


def test_a_rank_starts_with_no_state_but_a_fresh_interpreters_that_imported_torch(zygote, tmp_path):
    """No thread but its own, no torch thread-local state or mode, no atexit function, logging handler or warning
    filter beyond what importing torch gives a fresh `python -c` (the parity suite compares a torchrun worker's)."""
    state = ("import atexit, json, logging, threading, warnings, torch\n"
             "from torch.overrides import _get_current_function_mode_stack as fm\n"
             "from torch.utils._python_dispatch import _get_current_dispatch_mode_stack as dm\n"
             "print(json.dumps([len(threading.enumerate()), atexit._ncallbacks(), len(logging.root.handlers), "
             "len(warnings.filters), torch.is_grad_enabled(), torch.is_inference_mode_enabled(), len(fm()), len(dm()), "
             "str(torch.get_default_dtype()), 'torch._dynamo' in __import__('sys').modules]))\n")
    fresh = subprocess.run([sys.executable, "-c", state], capture_output=True, text=True, check=True).stdout
    code, log = forked(zygote, tmp_path, state)
    assert code == 0 and json.loads(log) == json.loads(fresh)


@pytest.mark.parametrize("end, status", [("pass", 3), ("os._exit(0)", 0), ("os._exit(5)", 5),
                                         ("os.kill(os.getpid(), signal.SIGSEGV)", -signal.SIGSEGV)])
def test_a_rank_ends_when_its_process_does_whatever_ended_it(zygote, tmp_path, end, status):
    # what the body returns is the status, unless the process ended first
    assert forked(zygote, tmp_path, f"import os, signal\n{end}\nstatus = 3\n")[0] == status


def test_what_a_rank_started_in_its_session_does_not_outlive_it(zygote, tmp_path):
    marker = tmp_path / "child.pid"
    code = (f"import subprocess, sys\nchild = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
            f"open({str(marker)!r}, 'w').write(str(child.pid))\n")
    assert forked(zygote, tmp_path, code)[0] == 0
    pid = int(marker.read_text())
    wait_until(lambda: not alive(pid), 10, "the rank's child gone")


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_the_end_waits_for_non_daemon_threads_and_runs_atexit_functions(zygote, tmp_path):
    """As a normal interpreter exit does (and `atexit._run_exitfuncs`, the one private call, still exists)."""
    assert callable(atexit._run_exitfuncs)
    done = tmp_path / "done"
    code = (
        "import atexit, sys, threading, time, traceback\n"
        "from pathlib import Path\n"
        f"folder = Path({str(tmp_path)!r})\n"
        "main = threading.main_thread().ident\n"
        "def late():  # writes once the body has returned: only an end that waits for it sees the file\n"
        "    while any(f.name == 'run' for f in traceback.extract_stack(sys._current_frames()[main])):\n"
        "        time.sleep(0.01)\n"
        "    (folder / 'thread').write_text('ran')\n"
        "threading.Thread(target=late).start()\n"
        "atexit.register(lambda: (folder / 'done').write_text((folder / 'thread').read_text() + ' then atexit'))\n")
    assert forked(zygote, tmp_path, code)[0] == 0  # the rank's end (rank_process.exit_like_python) did both
    assert done.read_text() == "ran then atexit"
