"""A rank's channel to its host agent, beside its stdout and stderr: what the runner itself has to say about the
rank's run, which the agent puts where it belongs (runner.worker.relay).

A rank's descriptors 1 and 2 are its program's own (a torchrun-style script cannot tell them from torchrun's); the
runner's own lines do not go there. Events are JSON lines on a pipe the agent gave the rank:

* ``{"k": "line", "text": ...}`` — a plain progress line (runner.training.progress): into the rank's log, and onto
  the agent's terminal for rank 0 (unless its bar is live there) and for ranks shown with a prefix;
* ``{"k": "bar", ...}`` — the state of rank 0's live bar, drawn by the agent on its terminal (a TTY);
* ``{"k": "note", "text": ...}`` — a line for the rank's log only (what the launch decided for it: its
  interface, its attempt);
* ``{"k": "life", "event": ...}`` — a moment of the rank's life its agent watches for (runner.worker.rank_life):
  ``joined`` its default process group, ``destroyed`` it, ``returned`` (its script or recipe: the process is ending);
* ``{"k": "alive", "progressed": ..., "step": ..., "resumed": ...}`` — its watch thread runs (so the GIL is to be
  had), about once a second, when the rank last completed a collective or a progress step (``time.time()``), its
  progress bar's step and the step its first bar began at (a resumed attempt's: what a lost host cost);
* ``{"k": "copy", "host": ..., "seq": ..., "step": ...}`` — rank 0 resumes from the copy of the run's checkpoint
  that host held (runner.training.copies).

A process the runner did not start (a recipe called on its own, a test) has no channel (its run context's is
None), and progress goes to its stdout.
"""

from __future__ import annotations

import json
import os
from typing import Any


class AgentChannel:
    """A rank's channel to its host agent: the pipe the agent gave it, made once by the rank (runner.worker.rank)
    and handed to its run context. ``live_bar``: the agent draws this rank's progress bar live on its terminal
    (rank 0, log.console=main, a TTY there)."""

    def __init__(self, fd: int, live_bar: bool) -> None:
        self._fd: int | None = fd
        self.live_bar = live_bar

    def send(self, event: dict[str, Any]) -> None:
        """One event, in one write (a pipe keeps writes of up to 4 KiB whole)."""
        fd = self._fd
        if fd is None:
            return
        data = (json.dumps(event, separators=(",", ":")) + "\n").encode()
        try:
            while data:
                data = data[os.write(fd, data):]
        except OSError:  # the agent is gone: the rank is about to be too (it dies with its agent)
            self._fd = None

    def note(self, text: str) -> None:
        """A line for this rank's log alone."""
        for line in text.splitlines():
            self.send({"k": "note", "text": line})

    def life(self, event: str) -> None:
        """``joined``, ``destroyed`` or ``returned`` (see the module docstring)."""
        self.send({"k": "life", "event": event})

    def alive(self, progressed_s: float, step: int | None = None, resumed: int | None = None) -> None:
        """The watch runs; the rank last made progress at ``progressed_s``; ``step``: its progress bar's step (from
        the run's start), ``resumed``: the step its first bar started at (None: no bar yet)."""
        self.send({"k": "alive", "progressed": progressed_s, "step": step, "resumed": resumed})

    def resumed_copy(self, host: str, seq: int, step: int | None) -> None:
        """The run resumes from the copy of its checkpoint that ``host`` held: save ``seq`` of the run, at ``step``
        (runner.training.copies)."""
        self.send({"k": "copy", "host": host, "seq": seq, "step": step})

    def lines(self) -> LineSink:
        """Where plain progress lines go, as events."""
        return LineSink(self)


class LineSink:
    """Plain progress lines as events (what :class:`runner.training.progress.Progress` writes to)."""

    def __init__(self, channel: AgentChannel) -> None:
        self._channel = channel

    def write(self, text: str) -> int:
        for line in text.splitlines():
            self._channel.send({"k": "line", "text": line})
        return len(text)

    def flush(self) -> None:
        pass
