"""One rank as a process of its own: forked from the host agent (which holds torch already), its output on pipes
the agent relays (runner.worker.relay), its end known by its exit status.

What the rank's process looks like from inside is what a torchrun worker sees (``python -u script.py`` started
by torchrun's agent): its own session (a terminal's Ctrl-C reaches the agent, which passes it on), descriptors 1
and 2 that are real pipes with ``python -u``'s stream objects over them (runner.worker.stdio), the signal
dispositions of a fresh interpreter, the environment of the plan. It dies with its agent (``PR_SET_PDEATHSIG``),
so no rank outlives the process that watches it.

The rank ends by ``os._exit`` with its status once its body returns, after what a normal interpreter exit does
that a program can see (joining its non-daemon threads, its ``atexit`` functions), without the interpreter's
teardown: that is over half a second with torch loaded, and where torch's threads abort ("terminate called
without an active exception", seen in 3-5% of plain torchrun runs).
"""

from __future__ import annotations

import atexit
import ctypes
import faulthandler
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from runner.worker.relay import Echo, OutputRelay, close_fds, pipes_for
from runner.worker.stdio import reopen_standard_streams

_PR_SET_PDEATHSIG = 1
# what a fresh CPython sets apart from the defaults: SIGINT raises KeyboardInterrupt, SIGPIPE and SIGXFSZ ignored
_FRESH = {signal.SIGINT: signal.default_int_handler, signal.SIGPIPE: signal.SIG_IGN, signal.SIGXFSZ: signal.SIG_IGN}


def _libc_prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# looked up once, in the process that forks: a forked child must not dlopen/dlsym (the loader's lock may be held by
# another thread of its parent at the fork, and nothing in the child would ever release it)
_PRCTL = _libc_prctl()


def die_with_parent(signum: int = signal.SIGKILL) -> None:
    """Ask Linux to send this process ``signum`` when its parent dies, so no rank outlives its agent."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signum))


def fresh_signal_dispositions() -> None:
    """Every signal handled as a new Python process handles it (the agent's own handlers were inherited)."""
    for signum in signal.valid_signals():
        wanted = _FRESH.get(signum, signal.SIG_DFL)
        try:
            if signal.getsignal(signum) not in (wanted, None):
                signal.signal(signum, wanted)
        except (OSError, ValueError):  # SIGKILL, SIGSTOP, and the real-time signals Python does not manage
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


@dataclass
class RankProcess:
    """The agent's handle on one rank's process."""

    index: int  # the rank's index among its host's processes here (its local rank, for a host's share)
    pid: int
    pidfd: int  # readable once the process has exited
    code: int | None = None  # its exit status once reaped: the code, or -N for signal N
    signalled: list[int] = field(default_factory=list)  # what the agent sent it

    def reap(self, block: bool = False) -> int | None:
        """Its exit status if it has exited (``block``: once it has), else None. Whatever it started in its session
        is killed first (its process group, while its own pid still holds the group's number), so that nothing
        of it stays behind."""
        if self.code is None:
            try:
                info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT | (0 if block else os.WNOHANG))
            except ChildProcessError:
                return self.code
            if info is None:
                return None
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            _, status = os.waitpid(self.pid, 0)
            self.code = os.waitstatus_to_exitcode(status)
            os.close(self.pidfd)
        return self.code

    @property
    def running(self) -> bool:
        return self.reap() is None

    def kill(self) -> None:
        """SIGKILL to the rank and everything in its process group; reaped."""
        if self.code is None:
            self.send(signal.SIGKILL, group=True)
            self.reap(block=True)

    def send(self, signum: int, group: bool = False) -> None:
        """Send ``signum`` to the rank (``group``: and every process it started in its session, by its process
        group, which is its pid), unless it has exited."""
        if self.code is not None:
            return
        self.signalled.append(signum)
        try:
            (os.killpg if group else os.kill)(self.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def import_once_for_all(ranks: int, code: Path | None = None) -> None:
    """What nearly every rank imports, imported here once before ``ranks`` ranks are forked (they share its pages
    and skip the work): ``torch._dynamo``, which torch imports with the first optimizer a process makes (about
    1.5-2 s of CPU each). Only for two ranks or more (for one it would save nothing), and only where the ranks' code
    may make an optimizer (:func:`may_make_an_optimizer`): elsewhere it costs the agent a second of CPU and delays
    every rank's start by as much. (It starts no thread: the agent stays safe to fork from.) What the import sets
    in the environment is taken back: ``TORCHINDUCTOR_CACHE_DIR``, from the agent's TMPDIR, is not the ranks' (a
    rank's own import sets it from its own TMPDIR, as under torchrun)."""
    if ranks >= 2 and "torch._dynamo" not in sys.modules and may_make_an_optimizer(code):
        before = dict(os.environ)
        import torch._dynamo  # noqa: F401

        os.environ.clear()
        os.environ.update(before)


def may_make_an_optimizer(code: Path | None) -> bool:
    """Whether the code the ranks start from (``code``: the script, or the recipe's module, where it is a file of the
    job's folder) may make a torch optimizer: unless its source names none ("optim" nowhere in it, in any case), yes.
    Code that is not at hand (an installed package's module, a zip file) is taken to make one."""
    if code is None:
        return True
    try:
        return "optim" in code.read_text(errors="replace").lower()
    except OSError:
        return True


def start_rank(index: int, log_path: str, echo: Echo, relay: OutputRelay, body: Callable[[int], int]) -> RankProcess:
    """Fork one rank: its output on new pipes that ``relay`` reads (into ``log_path``, and the terminal as ``echo``
    says), then ``body(events_fd)`` in the child, whose return value is the process's exit status."""
    pipes, (out_w, err_w, events_w) = pipes_for(index, log_path, echo)
    held = (*relay.own_fds(), *pipes.fds())
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the rank
        code = 70  # EX_SOFTWARE: the body did not return a status
        try:
            code = _become_rank(out_w, err_w, events_w, held, body)
        finally:
            os._exit(code)
    close_fds((out_w, err_w, events_w))
    relay.add(pipes)
    return RankProcess(index, pid, os.pidfd_open(pid))


def _become_rank(out_w: int, err_w: int, events_w: int, held: Iterable[int], body: Callable[[int], int]) -> int:
    os.setsid()  # its own session and process group, as torchrun's workers (start_new_session)
    die_with_parent()
    fresh_signal_dispositions()
    close_fds(held)  # the agent's ends of every rank's pipes, and the logs
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    close_fds((out_w, err_w))
    reopen_standard_streams()
    if faulthandler.is_enabled():  # as the agent's interpreter chose (PYTHONFAULTHANDLER, -X faulthandler): onto
        faulthandler.enable()  # the rank's own stderr
    code = body(events_w)
    exit_like_python()
    return code


def exit_like_python() -> None:
    """What an interpreter's normal exit does that a program sees: wait for its non-daemon threads, run its
    ``atexit`` functions, flush its streams. (Its teardown itself is skipped: see the module docstring.)"""
    current = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not current and not thread.daemon and thread.is_alive():
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
