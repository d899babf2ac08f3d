"""Progress of a recipe's loop: a live bar on rank 0's terminal, plain lines everywhere else.

``bar = ctx.progress(total, "train")`` (:meth:`runner.training.context.RunContext.progress`), then
``bar.update(loss=..., samples=...)`` once per step and ``bar.close()`` (or ``with``). Where it shows:

* rank 0, its host agent's terminal a TTY: a tqdm bar redrawn in place on the terminal alone (steps,
  percent, elapsed, ETA, samples/s, loss), drawn by the agent from the state the rank sends it
  (runner.worker.relay); what the rank prints meanwhile goes above the bar. Its log gets the plain
  lines instead (a redrawn line would fill it with ``\\r``);
* rank 0, its terminal not a TTY (CI, a pipe, Slurm's output file): plain lines on the terminal and in
  its log;
* every other rank: plain lines in its own log only (on the terminal too for ranks shown there with a
  prefix, log.console=all or a list).

A plain line is written at every tenth of the total, at least every ``interval_s`` between them (a
slow run still shows it is alive), and once more when the bar closes::

    progress: train step 120/600 (20%) · 1234 samples/s · loss 0.3123 · 4.1 s elapsed, eta 16.4 s

Nothing is collective: each rank counts its own steps and the samples it is told of (pass the global
batch, and every rank shows the job's throughput). Throughput is over the whole run (samples since
the bar opened / time since); the loss shown is smoothed (an exponential moving average).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from runner.common.formatting import duration

if TYPE_CHECKING:
    from runner.training.output import AgentChannel

LINES_PER_TOTAL = 10  # plain lines at every tenth of the total
LINE_INTERVAL_S = 60.0  # ... and at least this often between them
BAR_INTERVAL_S = 0.1  # the bar's redraws, at most this often
LOSS_SMOOTHING = 0.1  # weight of the newest loss in the one shown


def _rate(per_s: float) -> str:
    return f"{per_s:.0f}" if per_s >= 100 else f"{per_s:.3g}"


class StepCount:
    """The steps one process has taken, over all its bars: its watch (runner.worker.watch) tells a stall from
    progress by it. A rank makes one and hands it to its run context and its watch."""

    def __init__(self) -> None:
        self.taken = 0
        self.position: int | None = None  # the latest bar's step, counted from the run's start (its ``initial`` on)
        self.resumed: int | None = None  # the first bar's ``initial``: the step a resumed run started at


class Progress:
    """Steps of a loop as they are taken, shown as a live bar (``bar``: where its state goes, for its host agent
    to draw), as plain lines (``lines``: the streams they go to), or both. :func:`for_rank` chooses them for a rank of a job.

    ``initial``: steps already taken (a resumed run); throughput and ETA count only this run's. ``steps``: the
    process's count, which this bar's steps add to.
    """

    def __init__(self, total: int | None, desc: str = "", *, initial: int = 0,
                 bar: Callable[[dict[str, Any]], None] | None = None,
                 lines: Sequence[TextIO] = (), interval_s: float = LINE_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic, steps: StepCount | None = None) -> None:
        if total is not None and total < 0:
            raise ValueError(f"progress: total={total}; give the number of steps (>= 0), or None when unknown")
        self.total = total
        self.desc = desc
        self.n = initial
        self._initial = initial
        self._steps = steps
        if steps is not None:
            steps.position = initial
            steps.resumed = initial if steps.resumed is None else steps.resumed
        self._lines = tuple(lines)
        self._interval_s = interval_s
        self._clock = clock
        self._start = clock()
        self._samples = 0
        self._loss_avg = 0.0  # exponential moving average, debiased by the weight so far
        self._loss_weight = 0.0
        self._every = max(1, math.ceil(total / LINES_PER_TOTAL)) if total else None
        self._line_n = initial
        self._line_t = self._start
        self._closed = False
        self._bar = _BarState(bar, total, desc, initial, self._start) if bar is not None else None

    # -- what the loop calls ------------------------------------------------------------------------
    def update(self, n: int = 1, *, loss: float | None = None, samples: int | None = None) -> None:
        """``n`` more steps; ``loss``: the latest step's; ``samples``: how many these steps took (the global batch)."""
        self.n += n
        if self._steps is not None:
            self._steps.taken += n
            self._steps.position = self.n
        if samples:
            self._samples += samples
        if loss is not None:
            self._loss_avg = (1 - LOSS_SMOOTHING) * self._loss_avg + LOSS_SMOOTHING * float(loss)
            self._loss_weight = (1 - LOSS_SMOOTHING) * self._loss_weight + LOSS_SMOOTHING
        if self._closed:
            return
        now = self._clock()
        if self._bar is not None:
            self._bar.advance(now, self)
        if self._lines and (self._every and self.n // self._every > self._line_n // self._every
                            or now - self._line_t >= self._interval_s):
            self._write_line(now)

    def close(self) -> None:
        """The last plain line (unless the latest one says the same) and the bar in its final state; idempotent."""
        if self._closed:
            return
        self._closed = True
        now = self._clock()
        if self._bar is not None:
            self._bar.close(now, self)
        if self._lines and self.n != self._line_n:
            self._write_line(now)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- what it shows --------------------------------------------------------------------------------
    @property
    def loss(self) -> float | None:
        """The smoothed loss; None before the first."""
        return self._loss_avg / self._loss_weight if self._loss_weight else None

    def samples_per_s(self, now: float) -> float | None:
        elapsed = now - self._start
        return self._samples / elapsed if self._samples and elapsed > 0 else None

    def postfix(self, now: float) -> str:
        """``1234 samples/s, loss 0.3123``: what the bar shows beside tqdm's own figures."""
        rate, loss = self.samples_per_s(now), self.loss
        return ", ".join([*([f"{_rate(rate)} samples/s"] if rate is not None else []),
                          *([f"loss {loss:.4g}"] if loss is not None else [])])

    def line(self, now: float) -> str:
        """One plain line (the module docstring shows one)."""
        total = self.total
        parts = [f"step {self.n}/{total} ({100 * self.n // total if total else 100}%)" if total is not None
                 else f"step {self.n}"]
        rate, loss = self.samples_per_s(now), self.loss
        if rate is not None:
            parts.append(f"{_rate(rate)} samples/s")
        if loss is not None:
            parts.append(f"loss {loss:.4g}")
        elapsed = now - self._start
        timing = f"{duration(elapsed)} elapsed"
        if total and self._initial < self.n < total:
            timing += f", eta {duration((total - self.n) * elapsed / (self.n - self._initial))}"
        parts.append(timing)
        return f"progress: {self.desc + ' ' if self.desc else ''}" + " · ".join(parts)

    def _write_line(self, now: float) -> None:
        text = self.line(now) + "\n"
        for stream in self._lines:
            stream.write(text)
            stream.flush()
        self._line_n, self._line_t = self.n, now


class _BarState:
    """The live bar's state, sent to the host agent, which draws it on its terminal (runner.worker.relay): at most
    every BAR_INTERVAL_S, and at the close."""

    def __init__(self, send: Callable[[dict[str, Any]], None], total: int | None, desc: str, initial: int,
                 start: float) -> None:
        self._send = send
        self._total, self._desc, self._initial, self._start = total, desc, initial, start
        self._next = 0.0

    def advance(self, now: float, progress: Progress) -> None:
        if now >= self._next:
            self._next = now + BAR_INTERVAL_S
            self._send(self._state(now, progress, closed=False))

    def close(self, now: float, progress: Progress) -> None:
        self._send(self._state(now, progress, closed=True))

    def _state(self, now: float, progress: Progress, closed: bool) -> dict[str, Any]:
        return {"k": "bar", "n": progress.n, "total": self._total, "elapsed": now - self._start, "desc": self._desc,
                "initial": self._initial, "postfix": progress.postfix(now), "closed": closed}


def for_rank(agent: AgentChannel | None, steps: StepCount, total: int | None, desc: str = "", *, initial: int = 0,
             interval_s: float = LINE_INTERVAL_S) -> Progress:
    """A rank's progress, shown where the module docstring says, its steps counted in ``steps``. In a rank the
    runner started, everything goes to its host agent (``agent``: runner.training.output), which knows the terminal:
    a live bar drawn there for rank 0 on a TTY, plain lines into the rank's log (and onto the terminal for rank 0
    and prefixed ranks). Elsewhere (``agent`` None: a recipe called on its own), plain lines on stdout."""
    if agent is None:
        return Progress(total, desc, initial=initial, lines=[sys.stdout], interval_s=interval_s, steps=steps)
    return Progress(total, desc, initial=initial, bar=agent.send if agent.live_bar else None, lines=[agent.lines()],
                    interval_s=interval_s, steps=steps)
