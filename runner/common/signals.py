"""Stop requests: a signal that asks the recipe to checkpoint and return, rather than killing it.

Slurm sends one before a job's time limit or at preemption (``launcher.slurm.signal``, SIGUSR1 by
default). Launching processes forward it to their ranks; in a rank it only sets a flag, which the
recipe polls with ``ctx.should_stop()`` (agreed over all ranks, so that all of them checkpoint at
the same step).
"""

from __future__ import annotations

import re
import signal

DEFAULT = signal.SIGUSR1


def stop_signal(slurm_signal: str | None) -> signal.Signals:
    """The signal of a Slurm ``--signal`` value (``[R:|B:][SIG]USR1[@90]``, or a number)."""
    if not slurm_signal:
        return DEFAULT
    name = re.sub(r"^[RB]+:", "", slurm_signal).split("@")[0]
    if name.isdigit():
        return signal.Signals(int(name))
    return signal.Signals["SIG" + name.removeprefix("SIG")]


class StopRequest:
    """This process's flag: set by the stop signal, read by the run context."""

    requested = False
    signum: int | None = None

    @classmethod
    def install(cls, signum: int) -> None:
        """Catch the stop signal from now on. A request the process already had stays: a rank forked
        after its launcher was asked to stop starts asked."""
        cls.signum = signum
        signal.signal(signum, cls._handle)

    @classmethod
    def _handle(cls, signum: int, _frame: object) -> None:
        cls.requested = True
