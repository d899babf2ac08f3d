"""runner.worker.rank_process and stdio: a rank as a process of its own, forked with real pipes and a relay (no
torch.distributed): its streams are `python -u`'s, its signals a fresh interpreter's, its end its exit status,
and nothing it started outlives it."""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import threading
import traceback

import psutil
import pytest

from runner.worker.rank_process import may_make_an_optimizer, start_rank
from runner.worker.relay import Echo, OutputRelay
from runs import wait_until

STREAM_FACTS = ("import sys, json; print(json.dumps([[getattr(s, 'encoding'), s.errors, s.line_buffering, "
                "s.write_through, s.name, s.mode, type(s.buffer).__name__, s.fileno()] for s in (sys.stdout, sys.stderr)]))")


def forked(tmp_path, body, echo: Echo = Echo()):
    """Fork ``body(events_fd) -> status`` as a rank; wait for it; its exit status and its log."""
    relay = OutputRelay(*os.pipe()[1:], *os.pipe()[1:])  # a terminal nobody reads: the rank is not shown
    relay.start()
    rank = start_rank(0, str(tmp_path / "rank.log"), echo, relay, body)
    code = rank.reap(block=True)
    relay.drain(0)
    relay.close()
    return code, (tmp_path / "rank.log").read_text()


def test_the_streams_are_those_python_u_makes(tmp_path):
    """What torchrun's worker (`python -u script.py`) has: FileIO buffers, write-through, the interpreter's
    encoding and error handlers, named <stdout>/<stderr>, on descriptors 1 and 2."""
    expected = subprocess.run([sys.executable, "-u", "-c", STREAM_FACTS], capture_output=True, text=True,
                              env={**os.environ, "PYTHONIOENCODING": ""}).stdout

    def body(_events: int) -> int:
        exec(STREAM_FACTS)
        return 0

    code, log = forked(tmp_path, body)
    assert code == 0 and json.loads(log) == json.loads(expected)


def test_signals_are_handled_as_in_a_fresh_interpreter(tmp_path):
    previous = signal.signal(signal.SIGUSR1, lambda *_: None)
    try:
        def body(_events: int) -> int:
            handlers = {s.name: getattr(signal.getsignal(s), "name", str(signal.getsignal(s))) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1,
                                                                    signal.SIGPIPE, signal.SIGQUIT)}
            print(json.dumps(handlers))
            return 0

        code, log = forked(tmp_path, body)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert code == 0
    assert json.loads(log) == {"SIGINT": str(signal.default_int_handler), "SIGTERM": "SIG_DFL", "SIGUSR1": "SIG_DFL",
                               "SIGPIPE": "SIG_IGN", "SIGQUIT": "SIG_DFL"}


@pytest.mark.parametrize("end, status", [("pass", 3), ("os._exit(0)", 0), ("os._exit(5)", 5),
                                         ("os.kill(os.getpid(), signal.SIGSEGV)", -signal.SIGSEGV)])
def test_a_rank_ends_when_its_process_does_whatever_ended_it(tmp_path, end, status):
    def body(_events: int) -> int:
        exec(end)
        return 3  # what the body returns is the status, unless the process ended first

    assert forked(tmp_path, body)[0] == status


def test_what_a_rank_started_in_its_session_does_not_outlive_it(tmp_path):
    marker = tmp_path / "child.pid"

    def body(_events: int) -> int:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        marker.write_text(str(child.pid))
        return 0

    assert forked(tmp_path, body)[0] == 0
    pid = int(marker.read_text())
    wait_until(lambda: not alive(pid), 10, "the rank's child gone")


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_the_end_waits_for_non_daemon_threads_and_runs_atexit_functions(tmp_path):
    """As a normal interpreter exit does (and `atexit._run_exitfuncs`, the one private call, still exists)."""
    assert callable(atexit._run_exitfuncs)
    done = tmp_path / "done"

    def body(_events: int) -> int:
        main = threading.main_thread().ident

        def late() -> None:  # writes once body has returned: only an end that waits for it sees the file
            wait_until(lambda: not any(f.name == "body" for f in traceback.extract_stack(sys._current_frames()[main])),
                       30, "body returned")
            (tmp_path / "thread").write_text("ran")

        threading.Thread(target=late).start()
        atexit.register(lambda: done.write_text((tmp_path / "thread").read_text() + " then atexit"))
        return 0

    assert forked(tmp_path, body)[0] == 0  # the rank's end (rank_process.exit_like_python) did both
    assert done.read_text() == "ran then atexit"



def test_what_every_rank_imports_is_imported_once_before_two_or_more_are_forked_and_starts_no_thread(tmp_path):
    """torch._dynamo (which the first optimizer imports, ~2 s of CPU) is imported by the agent for two ranks or
    more, not for one, nor for code that names no optimizer; it leaves the agent with no new thread (a fork copies
    only the forking one) and its environment as it was (the import sets TORCHINDUCTOR_CACHE_DIR, which a script
    under torchrun does not see)."""
    (tmp_path / "plain.py").write_text("dist.all_reduce(torch.ones(1))\n")
    code = (
        "import os, sys, torch\n"
        "from pathlib import Path\n"
        "from runner.worker.rank_process import import_once_for_all\n"
        "before, env = set(os.listdir('/proc/self/task')), dict(os.environ)\n"
        "import_once_for_all(1); one = 'torch._dynamo' in sys.modules\n"
        f"import_once_for_all(2, Path({str(tmp_path / 'plain.py')!r})); plain = 'torch._dynamo' in sys.modules\n"
        "import_once_for_all(2); two = 'torch._dynamo' in sys.modules\n"
        "print(one, plain, two, sorted(set(os.listdir('/proc/self/task')) - before), dict(os.environ) == env)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "False False True [] True"  # the ranks' environment is the agent's


def test_code_that_names_no_optimizer_is_taken_not_to_make_one_and_code_not_at_hand_to_make_one(tmp_path) -> None:
    sources = {"adam.py": "model, opt = ctx.setup(net, torch.optim.Adam)\n", "own.py": "o = build_Optimizer()\n",
               "plain.py": "dist.all_reduce(torch.ones(1))\n"}
    for name, text in sources.items():
        (tmp_path / name).write_text(text)
    assert [may_make_an_optimizer(tmp_path / name) for name in sources] == [True, True, False]
    assert may_make_an_optimizer(None) and may_make_an_optimizer(tmp_path / "gone.py")
