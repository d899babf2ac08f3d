"""What reaches a host agent from outside while it runs, kept until its monitor reads it: the signals that reached it
(SIGINT, SIGTERM, the stop signal), the job ended from outside (another host lost: launcher=ssh and manual's `run`
say so, from another thread), and Ctrl-\\ (where every rank is). Each arrival wakes the agent, which sleeps on the
inbox's pipe and its zygote between looks (the signals' wakeup descriptor is the same pipe).

A signal handler and other threads only append here; the monitor takes what arrived (runner.worker.monitor), and
the agent's loop reads what the job's end needs (:attr:`AgentInbox.ended`, :meth:`AgentInbox.gone`): the inbox
remembers every end it was told, so nothing beside it keeps them again.
"""

from __future__ import annotations

import os
import select
import signal
from collections.abc import Iterator
from contextlib import contextmanager

from runner.worker.channel_records import JobFailure

TICK_S = 0.1  # the monitor's longest sleep while something is to be looked at


class AgentInbox:
    """One agent's inbox (see the module docstring), for all its attempts."""

    def __init__(self) -> None:
        self._signals: list[int] = []  # every signal that reached the agent, in order
        self._signals_read = 0
        self._ends: list[JobFailure] = []  # every end from outside, in order
        self._ends_read = 0
        self._where_asked = False
        self._wake_r: int | None = None
        self._wake_w: int | None = None

    # -- arrivals (a signal handler, any thread) ---------------------------------------------------------------
    def signalled(self, signum: int) -> None:
        self._signals.append(signum)

    def end(self, failure: JobFailure) -> None:
        self._ends.append(failure)
        self.wake()

    def ask_where(self) -> None:
        self._where_asked = True
        self.wake()

    def wake(self) -> None:
        if self._wake_w is not None:
            try:
                os.write(self._wake_w, b"\0")
            except OSError:
                pass

    # -- what the agent reads ----------------------------------------------------------------------------------
    @property
    def ended(self) -> bool:
        """The job was ended from outside: it ends with this attempt, whatever launcher.max_restarts allows."""
        return bool(self._ends)

    def gone(self) -> dict[str, str]:
        """Host -> why it is gone (an end of no rank): its ranks will say nothing."""
        return {f.host: f.text for f in self._ends if f.rank is None and f.host}

    def first_stop(self) -> int | None:
        """The first SIGINT or SIGTERM that reached the agent, if one did."""
        return next((s for s in self._signals if s in (signal.SIGINT, signal.SIGTERM)), None)

    def stopping(self) -> bool:
        """Before the ranks start: SIGINT or SIGTERM reached the agent, or the job was ended from outside."""
        return self.ended or self.first_stop() is not None

    def take_signals(self) -> list[int]:
        """The signals that arrived since the last take."""
        taken = self._signals[self._signals_read:]
        self._signals_read += len(taken)
        return taken

    def take_ends(self) -> list[JobFailure]:
        """The ends from outside that arrived since the last take."""
        taken = self._ends[self._ends_read:]
        self._ends_read += len(taken)
        return taken

    def take_where(self) -> bool:
        """Whether Ctrl-\\ arrived since the last take."""
        asked, self._where_asked = self._where_asked, False
        return asked

    # -- sleeping ----------------------------------------------------------------------------------------------
    @contextmanager
    def waking(self) -> Iterator[None]:
        """While the block runs, an arrival (a signal included: the signals' wakeup descriptor) wakes :meth:`wait`."""
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        os.set_blocking(wake_r, False)
        self._wake_r, self._wake_w = wake_r, wake_w
        previous = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        try:
            yield
        finally:
            signal.set_wakeup_fd(previous)
            self._wake_r = self._wake_w = None
            os.close(wake_r)
            os.close(wake_w)

    def wait(self, fileno: int, timeout_s: float = TICK_S) -> None:
        """Until ``fileno`` (the zygote: a rank ended) is readable, an arrival wakes the agent, or ``timeout_s``."""
        wake_r = self._wake_r
        try:
            select.select([fileno] + ([wake_r] if wake_r is not None else []), [], [], timeout_s)
        except InterruptedError:
            pass
        if wake_r is not None:
            try:
                os.read(wake_r, 4096)
            except (BlockingIOError, OSError):
                pass
