"""Where this process's output goes: its log file, and (rank 0 of a host) the launching terminal too.

The worker redirects a rank's output here first thing (:func:`redirect_output`); progress bars then
write to the terminal alone (:func:`terminal`, :func:`write_terminal_through`) and plain lines to the log
alone (:func:`log`).
"""

from __future__ import annotations

import os
import sys
from typing import TextIO


class _Tee:
    """A text stream writing to the terminal and the rank's log."""

    def __init__(self, terminal: TextIO, log: TextIO) -> None:
        self.terminal = terminal  # while a live progress bar is shown, its writer (see write_terminal_through)
        self.log = log

    def write(self, s: str) -> int:
        self.terminal.write(s)
        self.log.write(s)
        return len(s)

    def flush(self) -> None:
        self.terminal.flush()
        self.log.flush()

    def isatty(self) -> bool:
        return self.terminal.isatty()

    def fileno(self) -> int:
        return self.log.fileno()


class _Streams:
    """This rank's output streams, apart (set by :func:`redirect_output`)."""

    terminal: TextIO | None = None
    log: TextIO | None = None


def terminal() -> TextIO | None:
    """The launching terminal alone, for what belongs there and not in the log (a live progress bar);
    None on a rank that does not echo, or before :func:`redirect_output`. Not necessarily a TTY."""
    return _Streams.terminal


def log() -> TextIO | None:
    """This rank's log alone; None before :func:`redirect_output`."""
    return _Streams.log


def write_terminal_through(writer: TextIO | None) -> TextIO | None:
    """Send what the echoed stdout writes to the terminal through ``writer`` instead (a live progress
    bar's, which puts whole lines above the bar), or straight to the terminal again (None). The
    previous writer, to restore. No effect on a rank whose stdout is not echoed."""
    if not isinstance(sys.stdout, _Tee):
        return None
    previous = sys.stdout.terminal
    sys.stdout.terminal = writer if writer is not None else _Streams.terminal
    return previous if previous is not _Streams.terminal else None


class _PrefixedLines:
    """The terminal as the ranks of log.console=all share it: whole lines only, each ``[rank r host] ``-prefixed
    and written with one system call, so that lines of several processes never interleave mid-line (up to
    PIPE_BUF, 4 KiB, per write)."""

    def __init__(self, fd: int, prefix: str) -> None:
        self._fd = fd
        self._prefix = prefix
        self._partial = ""

    def write(self, s: str) -> int:
        text = self._partial + s
        *lines, self._partial = text.split("\n")
        if lines:
            os.write(self._fd, "".join(f"{self._prefix}{line}\n" for line in lines).encode(errors="replace"))
        return len(s)

    def flush(self) -> None:
        pass  # a partial line waits for its end (close() writes it)

    def close(self) -> None:
        if self._partial:
            os.write(self._fd, f"{self._prefix}{self._partial}\n".encode(errors="replace"))
            self._partial = ""

    def isatty(self) -> bool:
        return False  # no live bar among other ranks' lines

    def fileno(self) -> int:
        return self._fd


def finish() -> None:
    """Write what is left of an unfinished prefixed line (the rank is ending)."""
    if isinstance(_Streams.terminal, _PrefixedLines):
        _Streams.terminal.close()


def prefixed() -> bool:
    """This rank's terminal lines carry its prefix (log.console=all or a list of ranks)."""
    return isinstance(_Streams.terminal, _PrefixedLines)


def redirect_output(log_path: str, echo: bool, prefix: str = "") -> None:
    """Send this process's stdout and stderr (Python and C level) to its log; with ``echo``,
    Python-level stdout also still reaches the terminal (each line ``prefix``-ed, when given).
    :func:`terminal` and :func:`log` give the two streams apart."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    terminal = os.dup(1)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    log = os.fdopen(os.dup(1), "w", buffering=1)
    _Streams.log = log
    if echo:
        _Streams.terminal = _PrefixedLines(terminal, prefix) if prefix else os.fdopen(terminal, "w", buffering=1)
        sys.stdout = _Tee(_Streams.terminal, log)
    else:
        os.close(terminal)
        _Streams.terminal = None
        sys.stdout = log
    sys.stderr = os.fdopen(os.dup(2), "w", buffering=1)
