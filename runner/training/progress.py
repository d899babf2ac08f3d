"""Progress of a recipe's loop: a live bar on rank 0's terminal, plain lines everywhere else.

``bar = ctx.progress(total, "train")`` (:meth:`runner.training.context.RunContext.progress`), then
``bar.update(loss=..., samples=...)`` once per step and ``bar.close()`` (or ``with``). Where it shows:

* rank 0, its terminal a TTY: a tqdm bar redrawn in place on the terminal alone (steps, percent,
  elapsed, ETA, samples/s, loss); what the rank prints meanwhile goes above the bar, whole lines at a
  time. Its log gets the plain lines instead (a redrawn line would fill it with ``\\r``);
* rank 0, its terminal not a TTY (CI, a pipe, Slurm's output file): plain lines on the terminal and in
  its log;
* every other rank: plain lines in its own log only.

A plain line is written at every tenth of the total, at least every ``interval_s`` between them (a
slow run still shows it is alive), and once more when the bar closes::

    progress: train step 120/600 (20%) · 1234 samples/s · loss 0.3123 · 4.1 s elapsed, eta 16.4 s

Nothing is collective: each rank counts its own steps and the samples it is told of (pass the global
batch, and every rank shows the job's throughput). Throughput is over the whole run (samples since
the bar opened / time since); the loss shown is smoothed (an exponential moving average).
"""

from __future__ import annotations

import functools
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from runner.common.formatting import duration

LINES_PER_TOTAL = 10  # plain lines at every tenth of the total
LINE_INTERVAL_S = 60.0  # ... and at least this often between them
BAR_INTERVAL_S = 0.1  # the bar's redraws, at most this often
FALLBACK_COLUMNS = 80  # the bar's width on a terminal that does not say its own
LOSS_SMOOTHING = 0.1  # weight of the newest loss in the one shown


def _rate(per_s: float) -> str:
    return f"{per_s:.0f}" if per_s >= 100 else f"{per_s:.3g}"


class Progress:
    """Steps of a loop as they are taken, shown as a live bar (``bar``: a TTY stream), as plain lines
    (``lines``: the streams they go to), or both. :func:`for_rank` chooses them for a rank of a job.

    ``initial``: steps already taken (a resumed run); throughput and ETA count only this run's.
    """

    steps_taken = 0  # by this process, over all its bars: its watch tells a stall from progress by it

    def __init__(self, total: int | None, desc: str = "", *, initial: int = 0, bar: TextIO | None = None,
                 lines: Sequence[TextIO] = (), interval_s: float = LINE_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if total is not None and total < 0:
            raise ValueError(f"progress: total={total}; give the number of steps (>= 0), or None when unknown")
        self.total = total
        self.desc = desc
        self.n = initial
        self._initial = initial
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
        self._bar = _Bar(bar, total, desc, initial) if bar is not None else None

    # -- what the loop calls ------------------------------------------------------------------------
    def update(self, n: int = 1, *, loss: float | None = None, samples: int | None = None) -> None:
        """``n`` more steps; ``loss``: the latest step's; ``samples``: how many these steps took (the global batch)."""
        self.n += n
        Progress.steps_taken += n
        if samples:
            self._samples += samples
        if loss is not None:
            self._loss_avg = (1 - LOSS_SMOOTHING) * self._loss_avg + LOSS_SMOOTHING * float(loss)
            self._loss_weight = (1 - LOSS_SMOOTHING) * self._loss_weight + LOSS_SMOOTHING
        if self._closed:
            return
        now = self._clock()
        if self._bar is not None:
            self._bar.advance(n, now, self)
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
            self._bar.close(self, now)
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


class _Bar:
    """tqdm on a TTY. While it is shown, the echoed stdout reaches the terminal through an
    :class:`_AboveBar` (runner.worker.logs.write_terminal_through), so that printed lines do not break it."""

    def __init__(self, stream: TextIO, total: int | None, desc: str, initial: int) -> None:
        import runner.training.output as logs

        # train: 20%|████      | 120/600 [00:04<00:16, 1234 samples/s, loss 0.3123]
        fmt = ("{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]" if total
               else ("{desc}: " if desc else "") + "{n_fmt} steps [{elapsed}{postfix}]")
        # the terminal's width, followed as it changes; a terminal that reports none (0 columns: some
        # containers' pseudo-terminals) gets a fixed one rather than an empty bar
        sized = _columns(stream) > 0
        self._tqdm = _tqdm_class()(total=total, initial=initial, desc=desc or None, file=stream, leave=True,
                                   dynamic_ncols=sized, ncols=None if sized else FALLBACK_COLUMNS,
                                   mininterval=BAR_INTERVAL_S, bar_format=fmt, unit="step", disable=False)
        self._next_postfix = 0.0
        self._above = _AboveBar(self._tqdm, stream)
        self._routed = stream is logs.terminal()
        self._previous = logs.write_terminal_through(self._above) if self._routed else None

    def advance(self, n: int, now: float, progress: Progress) -> None:
        if now >= self._next_postfix:  # formatted as often as tqdm may redraw, not on every step
            self._tqdm.set_postfix_str(progress.postfix(now), refresh=False)
            self._next_postfix = now + BAR_INTERVAL_S
        self._tqdm.update(n)

    def close(self, progress: Progress, now: float) -> None:
        import runner.training.output as logs

        self._tqdm.set_postfix_str(progress.postfix(now), refresh=False)
        self._tqdm.close()
        if self._routed:
            logs.write_terminal_through(self._previous)
        self._above.finish()


@functools.cache
def _tqdm_class() -> type:
    """tqdm without its monitor thread (it only tunes miniters): one thread fewer in a rank at teardown."""
    from tqdm import tqdm

    return type("RankBar", (tqdm,), {"monitor_interval": 0})


def _columns(stream: TextIO) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is an OSError and a ValueError
        return 0


class _AboveBar:
    """A text stream to the terminal that writes whole lines above a live bar (cleared, then redrawn)."""

    def __init__(self, bar: Any, terminal: TextIO) -> None:
        self._bar = bar
        self._terminal = terminal
        self._partial = ""

    def write(self, s: str) -> int:
        head, newline, tail = (self._partial + s).rpartition("\n")
        if newline:
            self._bar.clear()
            self._terminal.write(head + newline)
            self._terminal.flush()
            self._bar.refresh()
        self._partial = tail
        return len(s)

    def flush(self) -> None:
        self._terminal.flush()

    def isatty(self) -> bool:
        return self._terminal.isatty()

    def fileno(self) -> int:
        return self._terminal.fileno()

    def finish(self) -> None:
        """Write what is left of an unfinished line (the bar is closed)."""
        if self._partial:
            self._terminal.write(self._partial)
            self._terminal.flush()
            self._partial = ""


def for_rank(rank: int, total: int | None, desc: str = "", *, initial: int = 0,
             interval_s: float = LINE_INTERVAL_S) -> Progress:
    """The progress of global rank ``rank``, shown where the module docstring says: a bar when rank 0's
    terminal is a TTY, else plain lines (rank 0: terminal and log; others: their log, and the terminal too
    when they stream to it with a prefix, log.console=all or a list)."""
    import runner.training.output as logs

    terminal, log = logs.terminal(), logs.log()
    if terminal is None and log is None:  # output not redirected by the runner (the recipe called on its own)
        terminal, log = (sys.stdout, None) if rank == 0 else (None, sys.stdout)
    elif rank != 0 and not logs.prefixed():
        terminal = None  # a local rank 0 of another host echoes too: its progress stays in its log
    if terminal is not None and terminal.isatty():
        return Progress(total, desc, initial=initial, bar=terminal, lines=[log] if log is not None else [],
                        interval_s=interval_s)
    return Progress(total, desc, initial=initial, lines=[s for s in (terminal, log) if s is not None],
                    interval_s=interval_s)
