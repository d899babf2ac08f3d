"""The exit statuses of `run`, of the tasks a scheduler starts, and of a host's share of a job."""

from __future__ import annotations

import os

OK = 0
FAILED = 1  # a rank failed (raised, was killed, or a preflight check failed)
INVALID = 2  # the spec, an override or the allocation was refused: nothing was started


def from_signal(signum: int) -> int:
    """The status of a process stopped by signal ``signum`` (the shell's 128 + n)."""
    return 128 + int(signum)


def signal_of(code: int) -> int | None:
    """The signal an exit status says stopped the process (128 + n), or None."""
    return code - 128 if 128 < code < 128 + 65 else None


def from_wait_status(status: int) -> int:
    """An exit status from ``os.waitpid``'s status: the code, or 128 + n for a process killed by signal n."""
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else from_signal(-code)
