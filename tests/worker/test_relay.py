"""runner.worker.relay: the host agent's side of its ranks' output, through real pipes (no rank processes):
every byte into the rank's log, the chosen ranks onto the terminal as log.console says, the runner's own events."""

from __future__ import annotations

import json
import os

import pytest

from runner.worker.relay import Echo, OutputRelay, pipes_for
from runs import wait_until

pytestmark = pytest.mark.unit


class Terminal:
    """The agent's stdout and stderr as pipes, read back after the fact."""

    def __init__(self) -> None:
        self.out_r, self.out_w = os.pipe()
        self.err_r, self.err_w = os.pipe()
        for fd in (self.out_r, self.err_r):
            os.set_blocking(fd, False)

    @staticmethod
    def _read(fd: int) -> bytes:
        chunks = []
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)

    def out(self) -> bytes:
        return self._read(self.out_r)

    def err(self) -> bytes:
        return self._read(self.err_r)


def start(tmp_path, terminal: Terminal, echoes: dict[int, Echo], bar_ok: bool = False):
    relay = OutputRelay(terminal.out_w, terminal.err_w, bar_ok=bar_ok)
    relay.start()
    writers = {}
    for rank, echo in echoes.items():
        pipes, ends = pipes_for(rank, str(tmp_path / f"rank{rank}.log"), echo)
        relay.add(pipes)
        writers[rank] = ends
    return relay, writers


def logged(path, data: bytes, timeout: float = 10.0) -> None:
    """Wait until the relay has written ``data`` to the log at ``path`` (the next write then comes after it)."""
    wait_until(lambda: path.exists() and path.read_bytes().endswith(data), timeout, f"{data!r} in {path}")


def event(fd: int, **fields) -> None:
    os.write(fd, (json.dumps(fields) + "\n").encode())


def test_every_byte_reaches_the_log_and_the_shown_rank_reaches_the_terminal_as_written(tmp_path):
    terminal = Terminal()
    relay, w = start(tmp_path, terminal, {0: Echo(shown=True, progress=True), 1: Echo()})
    os.write(w[0][0], b"epoch 1\rprogress 50%\r")  # a library's own bar: bytes as they come, \r kept
    logged(tmp_path / "rank0.log", b"progress 50%\r")
    os.write(w[0][1], b"a warning\n")
    os.write(w[1][0], b"rank 1 says\n")
    logged(tmp_path / "rank1.log", b"rank 1 says\n")
    os.write(w[1][1], b"rank 1 warns\n")
    relay.drain(0)
    relay.drain(1)
    relay.close()
    assert terminal.out() == b"epoch 1\rprogress 50%\r" and terminal.err() == b"a warning\n"
    assert (tmp_path / "rank0.log").read_bytes() == b"epoch 1\rprogress 50%\ra warning\n"
    assert (tmp_path / "rank1.log").read_bytes() == b"rank 1 says\nrank 1 warns\n"


def test_prefixed_ranks_show_whole_lines_each_with_its_prefix_and_the_last_partial_line_at_the_end(tmp_path):
    terminal = Terminal()
    relay, w = start(tmp_path, terminal, {3: Echo(shown=True, prefix="[rank 3 node1] ", progress=True)})
    os.write(w[3][0], b"one\ntw")
    os.write(w[3][0], b"o\nthree")
    logged(tmp_path / "rank3.log", b"three")
    os.write(w[3][1], b"oops\n")
    relay.drain(3)  # the rank exited: its unfinished line is shown too
    relay.close()
    assert terminal.out() == b"[rank 3 node1] one\n[rank 3 node1] two\n[rank 3 node1] three\n"
    assert terminal.err() == b"[rank 3 node1] oops\n"
    assert (tmp_path / "rank3.log").read_bytes() == b"one\ntwo\nthreeoops\n"


def test_progress_lines_go_to_the_log_and_to_the_terminal_only_where_the_echo_says_notes_to_the_log_only(tmp_path):
    terminal = Terminal()
    relay, w = start(tmp_path, terminal, {0: Echo(shown=True, progress=True), 2: Echo(shown=True)})
    event(w[0][2], k="line", text="progress: train step 5/10 (50%)")
    event(w[0][2], k="note", text="network: GLOO_SOCKET_IFNAME=lan0")  # one pipe: in the order written
    event(w[2][2], k="line", text="progress: train step 5/10 (50%) of rank 2")  # local rank 0 of another host
    relay.drain(0)
    relay.drain(2)
    relay.close()
    assert terminal.out() == b"progress: train step 5/10 (50%)\n"
    assert (tmp_path / "rank0.log").read_text() == "progress: train step 5/10 (50%)\nnetwork: GLOO_SOCKET_IFNAME=lan0\n"
    assert (tmp_path / "rank2.log").read_text() == "progress: train step 5/10 (50%) of rank 2\n"


def test_the_live_bar_is_drawn_here_cleared_for_a_printed_line_and_redrawn_after_it(tmp_path):
    terminal = Terminal()
    relay, w = start(tmp_path, terminal, {0: Echo(shown=True, progress=True, live_bar=True)}, bar_ok=True)
    state = dict(k="bar", total=10, elapsed=1.0, desc="train", initial=0, postfix="64 samples/s, loss 0.5")
    event(w[0][2], n=4, closed=False, **state)
    event(w[0][2], k="line", text="progress: train step 5/10 (50%)")  # the log's; the terminal has the bar
    relay.drain(0)  # in order: the bar is up before the line below is printed
    pipes, ends = pipes_for(0, str(tmp_path / "rank0b.log"), Echo(shown=True, progress=True, live_bar=True))
    relay.add(pipes)
    os.write(ends[0], b"printed meanwhile\n")
    logged(tmp_path / "rank0b.log", b"printed meanwhile\n")
    event(ends[2], n=10, closed=True, **state)
    relay.drain(0)
    relay.close()
    shown = terminal.out().decode()
    first, rest = shown.split("\r\x1b[Kprinted meanwhile\n")
    assert first.startswith("\rtrain:  40%|") and "4/10 [00:01<00:01, 64 samples/s, loss 0.5]" in first
    assert len(first.removeprefix("\r").removesuffix("\x1b[K")) == 80  # no terminal width to read: 80 columns
    assert rest.startswith("\rtrain:  40%|")  # redrawn under the line
    assert rest.endswith("10/10 [00:01<00:00, 64 samples/s, loss 0.5]\x1b[K\n")  # closed: its last state stays
    assert "progress:" not in shown and (tmp_path / "rank0.log").read_text() == "progress: train step 5/10 (50%)\n"


def test_no_live_bar_where_the_terminal_is_not_a_tty(tmp_path):
    terminal = Terminal()
    relay, w = start(tmp_path, terminal, {0: Echo(shown=True, progress=True, live_bar=True)}, bar_ok=False)
    event(w[0][2], k="bar", n=4, total=10, elapsed=1.0, desc="train", initial=0, postfix="", closed=False)
    event(w[0][2], k="line", text="progress: train step 5/10 (50%)")
    relay.drain(0)
    relay.close()
    assert terminal.out() == b"progress: train step 5/10 (50%)\n"


def test_a_rank_forks_with_none_of_the_relays_descriptors_left_open(tmp_path):
    """What a new rank must close (runner.worker.rank_process): every pipe end and log the relay holds, so that
    a rank's exit ends its pipes (no other rank keeps them open)."""
    terminal = Terminal()
    relay, w = start(tmp_path, terminal, {0: Echo(), 1: Echo()})
    held = set(relay.own_fds())
    for rank in (0, 1):
        assert all(fd not in held for fd in w[rank])  # the rank's ends are its own
    assert len(held) == 2 + 2 * 4  # the relay's wake-up pipe; three pipes and a log per rank
    relay.close()
