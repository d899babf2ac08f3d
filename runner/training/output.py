"""A rank's channel to its host agent, beside its stdout and stderr: what the runner itself has to say about the
rank's run, which the agent puts where it belongs (runner.worker.relay).

A rank's descriptors 1 and 2 are its program's own (a torchrun-style script cannot tell them from torchrun's); the
runner's own lines do not go there. Events are JSON lines on a pipe the agent gave the rank:

* ``{"k": "line", "text": ...}`` — a plain progress line (runner.training.progress): into the rank's log, and onto
  the agent's terminal for rank 0 (unless its bar is live there) and for ranks shown with a prefix;
* ``{"k": "bar", ...}`` — the state of rank 0's live bar, drawn by the agent on its terminal (a TTY);
* ``{"k": "note", "text": ...}`` — a line for the rank's log only (what the launch decided for it: its
  interface, its attempt).

A process the runner did not start (a recipe called on its own, a test) has no channel: :func:`connected` is
False, and progress goes to its stdout.
"""

from __future__ import annotations

import json
import os
from typing import Any


class _Channel:
    fd: int | None = None
    live_bar = False


def connect(fd: int, live_bar: bool) -> None:
    """This process is a rank whose agent reads ``fd``; ``live_bar``: its agent draws its progress bar live."""
    _Channel.fd = fd
    _Channel.live_bar = live_bar


def connected() -> bool:
    return _Channel.fd is not None


def live_bar() -> bool:
    """The agent draws this rank's progress bar on a terminal (rank 0, log.console=main, a TTY there)."""
    return _Channel.fd is not None and _Channel.live_bar


def send(event: dict[str, Any]) -> None:
    """One event, in one write (a pipe keeps writes of up to 4 KiB whole)."""
    fd = _Channel.fd
    if fd is None:
        return
    data = (json.dumps(event, separators=(",", ":")) + "\n").encode()
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:  # the agent is gone: the rank is about to be too (it dies with its agent)
        _Channel.fd = None


def note(text: str) -> None:
    """A line for this rank's log alone; on stderr where there is no agent."""
    if _Channel.fd is None:
        import sys

        print(text, file=sys.stderr, flush=True)
        return
    for line in text.splitlines():
        send({"k": "note", "text": line})


class LineSink:
    """Plain progress lines as events (what :class:`runner.training.progress.Progress` writes to)."""

    def write(self, text: str) -> int:
        for line in text.splitlines():
            send({"k": "line", "text": line})
        return len(text)

    def flush(self) -> None:
        pass
