"""Signal handling, in one place: handlers installed for a while and put back, signal names as specs give
them, and stop requests.

A stop request is a signal that asks the recipe to checkpoint and return rather than killing it: Slurm
sends one before a job's time limit or at preemption (``launcher.slurm.signal``), and ``launcher.stop_signal``
is the same for the other launchers (``kill -USR1 <run's pid>``). `run` and the host agents forward it to their
ranks; in a rank it only sets a flag (:class:`StopRequest`), which the recipe polls with ``ctx.should_stop()``
(agreed over all ranks, so that all of them checkpoint at the same step).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Union

Handler = Union[Callable[[int, Any], Any], int, signal.Handlers, None]

DEFAULT_STOP = signal.SIGUSR1


@contextlib.contextmanager
def handling(signals: Iterable[int], handler: Handler) -> Iterator[None]:
    """``handler`` for ``signals`` while the block runs; the previous handlers again after it."""
    previous = {s: signal.signal(s, handler) for s in dict.fromkeys(signals)}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


def stop_signals(stop_signal: int) -> tuple[int, ...]:
    """The signals `run`, its launch agent and the host agents pass on to what they started: SIGINT, SIGTERM and the
    stop signal (once each)."""
    return tuple(dict.fromkeys((signal.SIGINT, signal.SIGTERM, stop_signal)))


@contextlib.contextmanager
def passing_on(stop_signal: int, to: Callable[[int], None]) -> Iterator[None]:
    """While the block runs, SIGINT, SIGTERM and the stop signal go to ``to`` (which passes each on to what this
    process started); the previous handlers again after it."""
    with handling(stop_signals(stop_signal), lambda signum, _frame: to(signum)):
        yield


def parse_signal(value: str | None, default: signal.Signals = DEFAULT_STOP) -> signal.Signals:
    """The signal a spec names: ``USR1``, ``SIGUSR1``, ``10``, or a Slurm ``--signal`` value
    (``[R:|B:][SIG]USR1[@90]``)."""
    if not value:
        return default
    name = re.sub(r"^[RB]+:", "", value).split("@")[0]
    if name.isdigit():
        return signal.Signals(int(name))
    return signal.Signals["SIG" + name.removeprefix("SIG")]


def is_signal_name(value: str) -> bool:
    try:
        parse_signal(value)
    except (KeyError, ValueError):
        return False
    return True


class StopRequest:
    """A process's stop request: a flag that the stop signal sets once :meth:`install`-ed. The process that can be
    asked makes its own and hands it to what reads it (a signal handler needs an object to write to): a rank to its
    run context (``ctx.should_stop()``), a scheduler's task to its host agent (a request that came before the agent
    handled the signal itself). One made and never installed is never asked."""

    def __init__(self) -> None:
        self.requested = False

    def install(self, signum: int) -> None:
        """Catch the stop signal from now on."""
        signal.signal(signum, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        self.requested = True


def kill_child(pid: int) -> None:
    """SIGKILL to a child process of this one, and reap it (gone already: nothing to do)."""
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
