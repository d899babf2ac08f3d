"""The host agent's side of its ranks' output: every rank's stdout and stderr into its log, the chosen ranks' onto
the agent's own terminal, and the live progress bar.

Each rank writes to pipes at the file-descriptor level (descriptors 1 and 2, runner.worker.rank_process), as a
torchrun worker writes to its files under ``--redirects``/``--tee``; one thread here (:class:`OutputRelay`, as
torchrun's ``TailLog``) reads them all and

* appends everything each rank writes, both streams in the order they arrive, to the rank's log;
* shows what ``log.console`` chose on the agent's terminal: with ``main`` the host's first process as it
  writes it (its stdout on the agent's stdout, its stderr on its stderr, bytes unchanged: a library's own
  progress bar redraws as under torchrun); with ``all`` or a list of ranks, whole lines prefixed
  ``[rank r host] ``, each written with one system call so that lines of several ranks never interleave;
* reads each rank's event channel (runner.training.output): the plain progress lines of ``ctx.progress``
  (into the log, and onto the terminal for rank 0 or a prefixed rank) and, where rank 0 has a TTY here,
  the state of its live bar, which is drawn here, the one writer of this terminal: a line a rank writes
  meanwhile goes above the bar; and the moments of the rank's life, into its :class:`RankLife`, which the agent
  reads (runner.worker.rank_life: the end guard).
"""

from __future__ import annotations

import json
import os
import selectors
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from runner.worker.rank_life import RankLife

READ_CHUNK = 1 << 16
CLEAR_LINE = b"\r\x1b[K"
FALLBACK_COLUMNS = 80  # the bar's width on a terminal that does not say its own
OUT, ERR, EVENTS = "out", "err", "events"


@dataclass(frozen=True)
class Echo:
    """How one rank shows on the agent's terminal."""

    shown: bool = False  # its stdout and stderr reach the terminal
    prefix: str = ""  # before each line there ("" : bytes as written); log.console=all or a list of ranks
    progress: bool = False  # its plain progress lines reach the terminal too (rank 0, or a prefixed rank)
    live_bar: bool = False  # its bar is drawn live here (rank 0 with log.console=main, on a TTY)


@dataclass(kw_only=True)
class RankPipes:
    """The agent's ends of one rank's output: the read ends of its pipes, and its log."""

    rank: int
    out: int
    err: int
    events: int
    log: int
    echo: Echo
    life: RankLife = field(default_factory=lambda: RankLife(started=time.time()))  # what its events said of it
    partial: dict[str, bytes] = field(default_factory=dict)  # an unfinished line per stream (prefixed, events)

    def fds(self) -> tuple[int, ...]:
        return self.out, self.err, self.events, self.log


def _write_all(fd: int, data: bytes) -> None:
    while data:
        try:
            written = os.write(fd, data)
        except InterruptedError:
            continue
        except OSError:  # the terminal went away (a closed pipe): the log still has it all
            return
        data = data[written:]


class _Bar:
    """The live bar of one rank, drawn from the state its process sends (tqdm's own formatting)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.state: dict | None = None

    def text(self) -> bytes:
        from tqdm import tqdm

        s = self.state or {}
        total = s.get("total")
        try:
            columns = os.get_terminal_size(self.fd).columns or FALLBACK_COLUMNS
        except OSError:
            columns = FALLBACK_COLUMNS
        # train: 20%|████      | 120/600 [00:04<00:16, 1234 samples/s, loss 0.3123]
        fmt = ("{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]" if total
               else ("{desc}: " if s.get("desc") else "") + "{n_fmt} steps [{elapsed}{postfix}]")
        line = tqdm.format_meter(s.get("n", 0), total, s.get("elapsed", 0.0), ncols=columns, prefix=s.get("desc") or "",
                                 unit="step", bar_format=fmt, postfix=s.get("postfix") or None,
                                 initial=s.get("initial", 0))
        return line.encode(errors="replace")


class OutputRelay(threading.Thread):
    """One thread for all of a host's ranks (see the module docstring). ``stdout``/``stderr``: the agent's
    terminal; ``bar_ok``: its stdout is a TTY, where a live bar may be drawn."""

    def __init__(self, stdout: int = 1, stderr: int = 2, bar_ok: bool = False) -> None:
        super().__init__(name="runner-output", daemon=True)
        self._stdout, self._stderr = stdout, stderr
        self._bar_ok = bar_ok
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()  # the pipes' table, and the terminal (drain() writes from another thread)
        self._ranks: dict[int, RankPipes] = {}
        self._stopping = False
        self._bar: _Bar | None = None
        self._at_line_start = {self._stdout: True, self._stderr: True}

    # -- the agent's calls -----------------------------------------------------------------------------------
    def own_fds(self) -> tuple[int, ...]:
        """Every descriptor the relay holds, for a newly forked rank to close."""
        with self._lock:
            held = [fd for pipes in self._ranks.values() for fd in pipes.fds()]
        return (self._wake_r, self._wake_w, *held)

    def add(self, pipes: RankPipes) -> None:
        with self._lock:
            self._ranks[pipes.rank] = pipes
            for fd, stream in ((pipes.out, OUT), (pipes.err, ERR), (pipes.events, EVENTS)):
                os.set_blocking(fd, False)
                self._selector.register(fd, selectors.EVENT_READ, (pipes.rank, stream))
        self._wake()

    def life(self, rank: int) -> RankLife | None:
        """What rank ``rank``'s events said of its life so far (None once it has been drained)."""
        pipes = self._ranks.get(rank)
        return pipes.life if pipes is not None else None

    def drain(self, rank: int) -> None:
        """Rank ``rank`` has exited: take what is left in its pipes now (a child it started may hold them open
        longer; what it writes later is not waited for), finish its unfinished lines, close its log."""
        with self._lock:
            pipes = self._ranks.pop(rank, None)
            if pipes is None:
                return
            for fd, stream in ((pipes.out, OUT), (pipes.err, ERR), (pipes.events, EVENTS)):
                while True:
                    try:
                        data = os.read(fd, READ_CHUNK)
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError:
                        data = b""
                    if not data:
                        break
                    self._handle(pipes, stream, data)
                self._finish_stream(pipes, stream)
                try:
                    self._selector.unregister(fd)
                except (KeyError, ValueError):
                    pass
                os.close(fd)
            os.close(pipes.log)

    def close(self) -> None:
        """Drain every rank left, end the thread."""
        for rank in list(self._ranks):
            self.drain(rank)
        self._stopping = True
        self._wake()
        if self.is_alive():
            self.join(timeout=5)
        with self._lock:
            self._end_bar()
        self._selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    # -- the thread ------------------------------------------------------------------------------------------
    def run(self) -> None:
        while not self._stopping:
            for key, _ in self._selector.select(timeout=1.0):
                if key.data is None:
                    try:
                        os.read(self._wake_r, 4096)
                    except (BlockingIOError, OSError):
                        pass
                    continue
                rank, stream = key.data
                with self._lock:
                    pipes = self._ranks.get(rank)
                    if pipes is None:
                        continue
                    try:
                        data = os.read(key.fd, READ_CHUNK)
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:
                        data = b""
                    if data:
                        self._handle(pipes, stream, data)
                    else:  # every writer closed it (the rank and what it started have exited): drain() closes it
                        try:
                            self._selector.unregister(key.fd)
                        except (KeyError, ValueError):
                            pass

    # -- what arrives ----------------------------------------------------------------------------------------
    def _handle(self, pipes: RankPipes, stream: str, data: bytes) -> None:
        if stream == EVENTS:
            for line in self._lines(pipes, stream, data):
                self._event(pipes, line)
            return
        _write_all(pipes.log, data)
        echo = pipes.echo
        if not echo.shown:
            return
        terminal = self._stdout if stream == OUT else self._stderr
        if echo.prefix:
            lines = self._lines(pipes, stream, data)
            if lines:
                self._to_terminal(terminal, b"".join(echo.prefix.encode() + line + b"\n" for line in lines))
        else:
            self._to_terminal(terminal, data)

    @staticmethod
    def _lines(pipes: RankPipes, stream: str, data: bytes) -> list[bytes]:
        *lines, pipes.partial[stream] = (pipes.partial.get(stream, b"") + data).split(b"\n")
        return lines

    def _finish_stream(self, pipes: RankPipes, stream: str) -> None:
        rest = pipes.partial.pop(stream, b"")
        if not rest:
            return
        if stream == EVENTS:
            self._event(pipes, rest)
        elif pipes.echo.shown and pipes.echo.prefix:
            self._to_terminal(self._stdout if stream == OUT else self._stderr, pipes.echo.prefix.encode() + rest + b"\n")

    def _event(self, pipes: RankPipes, line: bytes) -> None:
        try:
            event = json.loads(line)
        except ValueError:
            return
        kind = event.get("k")
        if kind == "note":  # the runner's own line about this rank: its log only
            _write_all(pipes.log, (event.get("text", "") + "\n").encode(errors="replace"))
        elif kind == "line":  # a plain progress line
            text = (event.get("text", "") + "\n").encode(errors="replace")
            _write_all(pipes.log, text)
            echo = pipes.echo
            if echo.shown and echo.progress and not (echo.live_bar and self._bar_ok):
                self._to_terminal(self._stdout, echo.prefix.encode() + text)
        elif kind == "bar" and pipes.echo.live_bar and self._bar_ok:
            self._draw_bar(event)
        elif kind in ("life", "alive", "copy"):
            pipes.life.heard(event, time.time())

    # -- the terminal ----------------------------------------------------------------------------------------
    def _to_terminal(self, fd: int, data: bytes) -> None:
        bar = self._bar
        if bar is not None and bar.state is not None:
            _write_all(bar.fd, CLEAR_LINE)
        _write_all(fd, data)
        self._at_line_start[fd] = data.endswith(b"\n")
        if bar is not None and bar.state is not None and self._at_line_start.get(bar.fd, True):
            _write_all(bar.fd, b"\r" + bar.text() + b"\x1b[K")

    def _draw_bar(self, event: dict) -> None:
        if self._bar is None:
            self._bar = _Bar(self._stdout)
        bar = self._bar
        bar.state = event
        if not self._at_line_start.get(bar.fd, True):
            return  # a line the rank has not finished: the bar waits for its end
        _write_all(bar.fd, b"\r" + bar.text() + b"\x1b[K")
        if event.get("closed"):
            _write_all(bar.fd, b"\n")
            bar.state = None

    def _end_bar(self) -> None:
        """A bar left open (its rank died): its last state stays on the screen, the cursor below it."""
        if self._bar is not None and self._bar.state is not None:
            _write_all(self._bar.fd, b"\n")
            self._bar.state = None


def pipes_for(rank: int, log_path: str, echo: Echo) -> tuple[RankPipes, tuple[int, int, int]]:
    """Pipes and the log of one rank: the agent's ends (:class:`RankPipes`) and the rank's write ends
    (stdout, stderr, events), which the rank takes as its descriptors 1 and 2 and its event channel."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    ev_r, ev_w = os.pipe()
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    return RankPipes(rank=rank, out=out_r, err=err_r, events=ev_r, log=log, echo=echo), (out_w, err_w, ev_w)


def close_fds(fds: Iterable[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
