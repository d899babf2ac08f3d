"""runner.worker.zygote: the fresh interpreter every rank of a host is forked from. It is started by exec (not a copy
of the agent), holds torch and nothing of the runner's state, forks with one thread, says how each child ended, dies
with its agent (and its ranks with it), and a user's folder cannot shadow the runner in it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading

import psutil
import pytest

from runner.spec.targets import TargetProblem
from runner.worker.relay import close_fds
from runner.worker.zygote import PRELOAD, Fork, Zygote, ZygoteGone
from runner.worker.zygote_wire import receive, send
from runs import wait_until


def _devnull_fds() -> tuple[int, int, int]:
    out = os.open(os.devnull, os.O_WRONLY)
    return out, os.dup(out), os.dup(out)


def _fork(zygote: Zygote, code: str, folder, held_signals: tuple[int, ...] = ()) -> object:
    (folder / "bodies.py").write_text("def run(code, events):\n    scope = {}\n    exec(code, scope)\n"
                                      "    return scope.get('status', 0)\n")
    fds = _devnull_fds()
    try:
        return zygote.fork(0, fds, code, target="bodies:run", workdir=str(folder), held_signals=held_signals)
    finally:
        close_fds(fds)


def test_messages_cross_with_the_descriptors_they_carry() -> None:
    import socket

    a, b = socket.socketpair()
    r, w = os.pipe()
    received = []
    reader = threading.Thread(target=lambda: received.append(receive(b)))
    reader.start()
    send(a, Fork(3, "m:f", {"big": "x" * 300_000}), [w])  # larger than a socket's buffer: it arrives in pieces
    reader.join(60)
    message, fds = received[0]
    assert message == Fork(3, "m:f", {"big": "x" * 300_000}) and len(fds) == 1
    os.write(fds[0], b"through")
    assert os.read(r, 16) == b"through"
    close_fds((r, w, *fds))
    a.close()
    with pytest.raises(EOFError):
        receive(b)
    b.close()


def test_the_zygote_is_a_fresh_interpreter_of_its_own_with_one_thread(zygote) -> None:
    proc = psutil.Process(zygote.process.pid)
    # it answers (preloaded) first: Popen returns once the exec has begun, and until the kernel has set up the new
    # program's arguments /proc/<pid>/cmdline reads empty (seen once on a loaded machine)
    assert zygote.try_target("json:nothing", None).message.startswith("module 'json'")
    assert proc.ppid() == os.getpid()  # this process is its agent
    assert os.getsid(proc.pid) == proc.pid  # its own session: a terminal's Ctrl-C is the agent's to pass on
    assert proc.cmdline()[:3] == [sys.executable, "-u", "-c"]  # started by exec, as torchrun starts a worker
    assert proc.cmdline()[-len(sys.argv):] == sys.argv  # and it ends with its agent's own: ps tells whose it is
    assert len(os.listdir(f"/proc/{proc.pid}/task")) == 1  # no thread at any fork


def test_a_rank_has_torch_imported_and_no_cuda_initialised_and_the_runners_own_modules_only(zygote, tmp_path) -> None:
    out = tmp_path / "seen.json"
    code = (f"import json, sys, torch\nopen({str(out)!r}, 'w').write(json.dumps([sorted(m for m in sys.modules if "
            f"m in {list(PRELOAD)!r}), torch.cuda.is_initialized(), 'torch._dynamo' in sys.modules]))\n")
    rank = _fork(zygote, code, tmp_path)
    assert rank.reap(block=True) == 0
    assert json.loads(out.read_text()) == [sorted(PRELOAD), False, False]


def test_it_says_how_each_rank_ended(zygote, tmp_path) -> None:
    assert _fork(zygote, "status = 7", tmp_path).reap(block=True) == 7
    rank = _fork(zygote, "import time\ntime.sleep(300)", tmp_path)
    assert rank.reap() is None and rank.running
    rank.kill()
    assert rank.code == -signal.SIGKILL and not rank.running


HANDLES_USR1_ONCE_GATE_OPENS = textwrap.dedent("""
    import signal, time
    from pathlib import Path
    ends = time.monotonic() + 60
    while not Path({gate!r}).exists() and time.monotonic() < ends:
        time.sleep(0.01)
    got = []
    signal.signal(signal.SIGUSR1, lambda signum, frame: got.append(signum))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGUSR1])
    status = 0 if got == [signal.SIGUSR1] else 3
""")


@pytest.mark.parametrize("held", [True, False], ids=["held", "not-held"])
def test_a_held_signal_sent_before_the_body_handles_it_waits_for_its_handler(zygote, tmp_path, held) -> None:
    """A recipe rank's stop signal is held from its fork (runner.worker.attempt.start_ranks): one sent before the
    rank installed its handler reaches the handler once the rank lets it through. Not held, it is lost (it came while
    the rank still had the zygote's SIG_IGN) or ends the rank (it came after the rank took a fresh process's
    dispositions): never the request the recipe would see."""
    gate = tmp_path / "gate"
    rank = _fork(zygote, HANDLES_USR1_ONCE_GATE_OPENS.format(gate=str(gate)), tmp_path,
                 held_signals=(signal.SIGUSR1,) if held else ())
    os.kill(rank.pid, signal.SIGUSR1)
    gate.touch()
    code = rank.reap(block=True)
    assert code == 0 if held else code in (3, -signal.SIGUSR1), code


def test_a_target_is_tried_in_a_child_of_the_zygote(zygote, tmp_path) -> None:
    (tmp_path / "okmod.py").write_text("def main(ctx, cfg):\n    pass\n")
    (tmp_path / "badmod.py").write_text("raise RuntimeError('at import')\n")
    assert zygote.try_target("okmod:main", str(tmp_path)) is None
    problem = zygote.try_target("badmod:main", str(tmp_path))
    assert isinstance(problem, TargetProblem) and "RuntimeError: at import" in problem.message


def test_a_target_is_tried_from_here_once_the_zygote_has_ended(tmp_path) -> None:
    """Zygote.target_problem: the zygote's answer while it runs; once it has ended, the same question answered from
    this process (runner.spec.targets, a forked child), not ZygoteGone."""
    (tmp_path / "badmod.py").write_text("raise RuntimeError('at import')\n")
    started = Zygote.start()
    try:
        assert "RuntimeError: at import" in started.target_problem("badmod:main", str(tmp_path)).message
    finally:
        started.close()
    with pytest.raises(ZygoteGone):
        started.try_target("badmod:main", str(tmp_path))
    assert "RuntimeError: at import" in started.target_problem("badmod:main", str(tmp_path)).message


def test_a_users_runner_package_in_the_folder_it_starts_in_does_not_shadow_the_runner(tmp_path) -> None:
    (tmp_path / "runner").mkdir()
    (tmp_path / "runner" / "__init__.py").write_text("raise SystemExit('the user runner was imported')\n")
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        started = Zygote.start()
    finally:
        os.chdir(here)
    try:
        assert started.try_target("json:nothing", None) is not None
    finally:
        started.close()


def test_a_zygote_that_ended_is_said_so_and_its_ranks_count_as_killed(tmp_path) -> None:
    started = Zygote.start()
    rank = _fork(started, "import time\ntime.sleep(300)", tmp_path)
    started.process.kill()
    assert rank.reap(block=True) == -signal.SIGKILL
    wait_until(lambda: not psutil.pid_exists(rank.pid) or psutil.Process(rank.pid).status() == psutil.STATUS_ZOMBIE,
               30, "the rank ended with its zygote")
    with pytest.raises(ZygoteGone, match="killed by SIGKILL"):
        _fork(started, "pass", tmp_path)
    started.close()


def test_the_zygote_and_its_ranks_die_with_their_agent(tmp_path) -> None:
    """An agent killed outright leaves no zygote and no rank behind (PR_SET_PDEATHSIG, twice)."""
    pids = tmp_path / "pids.json"
    (tmp_path / "bodies.py").write_text("def run(code, events):\n    import time\n    time.sleep(300)\n")
    agent = textwrap.dedent(f"""
        import json, os
        from runner.worker.zygote import Zygote
        zygote = Zygote.start()
        out = os.open(os.devnull, os.O_WRONLY)
        rank = zygote.fork(0, (out, out, out), None, target="bodies:run", workdir={str(tmp_path)!r})
        open({str(pids)!r}, "w").write(json.dumps([zygote.process.pid, rank.pid]))
        os.kill(os.getpid(), 9)
    """)
    done = subprocess.run([sys.executable, "-c", agent], timeout=120)
    assert done.returncode == -signal.SIGKILL
    for pid in json.loads(pids.read_text()):
        wait_until(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 30,
                   f"process {pid} ended with its agent")


def test_an_exited_message_is_kept_for_whoever_asks_later(zygote, tmp_path) -> None:
    first = _fork(zygote, "status = 1", tmp_path)
    second = _fork(zygote, "status = 2", tmp_path)
    assert second.reap(block=True) == 2 and first.reap(block=True) == 1  # read in any order
