"""What makes a newly forked child a rank (:func:`become_rank`), and how it ends (:func:`exit_like_python`): a rank is
forked by its host's zygote (runner.worker.zygote), a fresh interpreter that holds torch already; its output goes to
pipes its host agent relays (runner.worker.relay), and its end is known by its exit status.

What the rank's process looks like from inside is what a torchrun worker sees (``python -u script.py`` started
by torchrun's agent): its own session (a terminal's Ctrl-C reaches the agent, which passes it on), descriptors 1
and 2 that are real pipes with ``python -u``'s stream objects over them (runner.worker.stdio), the signal
dispositions and random streams of a fresh interpreter, the environment of the plan. It dies with the zygote
(``PR_SET_PDEATHSIG``), which dies with its agent, so no rank outlives the process that watches it.

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

from runner.worker.relay import close_fds
from runner.worker.stdio import reopen_standard_streams

STACK_SIGNAL = signal.SIGQUIT  # a rank writes every thread's Python stack to its log (the agent asks the ranks
# that did not arrive at a collective that timed out; Ctrl-\ too)

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


def fresh_signal_dispositions(blocked: Iterable[int] = ()) -> None:
    """Every signal handled as a new Python process handles it (what the forking process set was inherited), and
    none blocked but ``blocked`` (signals the body lets through itself once it handles them: runner.worker.zygote)."""
    for signum in signal.valid_signals():
        wanted = _FRESH.get(signum, signal.SIG_DFL)
        try:
            if signal.getsignal(signum) not in (wanted, None):
                signal.signal(signum, wanted)
        except (OSError, ValueError):  # SIGKILL, SIGSTOP, and the real-time signals Python does not manage
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, list(blocked))


def become_rank(parent: int, out_w: int, err_w: int, events_w: int, held: Iterable[int],
                body: Callable[[int], int], blocked: Iterable[int] = ()) -> int:
    """Turn a newly forked child of ``parent`` into a rank, then run ``body(events_w)``; the exit status. ``out_w``,
    ``err_w``: its descriptors 1 and 2 from here on; ``held``: the forking process's descriptors, which the rank must
    not keep; ``blocked``: signals that stay blocked until the body lets them through."""
    os.setsid()  # its own session and process group, as torchrun's workers (start_new_session)
    die_with_parent()
    if os.getppid() != parent:  # its parent died before it asked to die with it
        os._exit(1)
    fresh_signal_dispositions(blocked)
    close_fds(held)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    close_fds((out_w, err_w))
    reopen_standard_streams()
    if faulthandler.is_enabled():  # as the interpreter chose (PYTHONFAULTHANDLER, -X faulthandler): onto
        faulthandler.enable()  # the rank's own stderr
    fresh_random_streams()
    code = body(events_w)
    exit_like_python()
    return code


def fresh_random_streams() -> None:
    """Random generators of its own, as a new interpreter that imported torch seeds them: torch's CPU generator and
    numpy's global one from the OS (a fork copied its parent's, so that every rank drew the same numbers). Python's
    ``random`` is reseeded by CPython at every fork; CUDA's generators are made when CUDA is first used, in the rank
    (the process it was forked from never initialised CUDA)."""
    import torch

    torch.default_generator.seed()
    numpy = sys.modules.get("numpy")  # imported by torch, where installed
    if numpy is not None:
        numpy.random.seed()


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
