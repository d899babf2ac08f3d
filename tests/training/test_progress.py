"""Progress (runner/progress.py, ctx.progress): plain lines at every tenth and at the end, with steps,
throughput, smoothed loss, elapsed and ETA; a live bar on a TTY that never reaches the log; rank 0's
terminal and every rank's own log in real runs."""

from __future__ import annotations

import fcntl
import io
import json
import os
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from conftest import REPO
from runner.common.formatting import duration
from runner.training.progress import Progress
from runs import run, run_folder

LINE = re.compile(r"^progress: (?:(\w+) )?step (\d+)(?:/(\d+) \((\d+)%\))?")


class Clock:
    """Time that moves only when the test says."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def progress_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("progress: ")]


def steps_of(lines: list[str]) -> list[int]:
    return [int(LINE.match(line).group(2)) for line in lines]


# ------------------------------------------------------------------------------ plain lines, no processes


@pytest.mark.unit
def test_a_line_at_every_tenth_with_throughput_loss_elapsed_and_eta():
    clock, log = Clock(), io.StringIO()
    bar = Progress(20, "train", lines=[log], clock=clock)
    for _ in range(20):
        clock.t += 0.5
        bar.update(loss=0.5, samples=64)
    bar.close()
    lines = progress_lines(log.getvalue())
    assert steps_of(lines) == [2, 4, 6, 8, 10, 12, 14, 16, 18, 20]  # the last mark is the end: no line twice
    assert lines[1] == "progress: train step 4/20 (20%) · 128 samples/s · loss 0.5 · 2.0 s elapsed, eta 8.0 s"
    assert lines[-1] == "progress: train step 20/20 (100%) · 128 samples/s · loss 0.5 · 10.0 s elapsed"


@pytest.mark.unit
def test_a_resumed_run_counts_only_its_own_steps_for_throughput_and_eta():
    clock, log = Clock(), io.StringIO()
    with Progress(100, initial=60, lines=[log], clock=clock) as bar:
        for _ in range(40):
            clock.t += 1.0
            bar.update(samples=10)
    lines = progress_lines(log.getvalue())
    assert steps_of(lines) == [70, 80, 90, 100]
    assert lines[0] == "progress: step 70/100 (70%) · 10 samples/s · 10.0 s elapsed, eta 30.0 s"


@pytest.mark.unit
def test_closing_early_says_where_it_stopped_once():
    clock, log = Clock(), io.StringIO()
    bar = Progress(20, "train", lines=[log], clock=clock)
    for _ in range(7):
        clock.t += 1.0
        bar.update()
    bar.close()
    bar.close()
    bar.update(3)  # after close: counted, not shown
    lines = progress_lines(log.getvalue())
    assert steps_of(lines) == [2, 4, 6, 7]
    assert lines[-1] == "progress: train step 7/20 (35%) · 7.0 s elapsed, eta 13.0 s"
    assert bar.n == 10


@pytest.mark.unit
def test_without_a_total_lines_come_every_interval():
    clock, log = Clock(), io.StringIO()
    bar = Progress(None, lines=[log], interval_s=5.0, clock=clock)
    for _ in range(12):
        clock.t += 1.0
        bar.update()
    bar.close()
    assert progress_lines(log.getvalue()) == ["progress: step 5 · 5.0 s elapsed", "progress: step 10 · 10.0 s elapsed",
                                              "progress: step 12 · 12.0 s elapsed"]


@pytest.mark.unit
def test_a_slow_run_gets_a_line_between_tenths_once_the_interval_passed():
    clock, log = Clock(), io.StringIO()
    bar = Progress(1000, lines=[log], interval_s=30.0, clock=clock)
    for _ in range(50):
        clock.t += 1.0
        bar.update()
    assert steps_of(progress_lines(log.getvalue())) == [30]  # no tenth yet (100 steps), one line for liveness


@pytest.mark.unit
def test_the_loss_shown_is_smoothed():
    bar = Progress(10, lines=[io.StringIO()], clock=Clock())
    assert bar.loss is None
    bar.update(loss=2.0)
    assert bar.loss == pytest.approx(2.0)  # no bias towards zero at the start
    bar.update(loss=0.0)
    assert 0.0 < bar.loss < 2.0 and bar.loss == pytest.approx(0.18 / 0.19)


@pytest.mark.unit
def test_a_negative_total_is_refused():
    with pytest.raises(ValueError, match="total=-1"):
        Progress(-1)


@pytest.mark.unit
def test_durations_read_as_seconds_minutes_hours():
    assert [duration(s) for s in (4.14, 59.94, 725, 11220)] == ["4.1 s", "59.9 s", "12 min 05 s", "3 h 07 min"]


# ------------------------------------------------------------------------------ the live bar


def test_on_a_tty_the_bar_redraws_in_place_and_the_log_gets_plain_lines_only():
    tty, log = FakeTTY(), io.StringIO()
    with Progress(20, "train", bar=tty, lines=[log]) as bar:
        for _ in range(20):
            bar.update(loss=0.5, samples=64)
    shown = tty.getvalue()
    assert shown.count("\r") >= 2 and shown.endswith("\n")
    final = shown.rstrip("\n").rsplit("\r", 1)[1]  # what the terminal shows at the end
    assert final.startswith("train: 100%|") and "20/20 [" in final and "samples/s" in final and "loss 0.5]" in final
    assert "\r" not in log.getvalue() and "█" not in log.getvalue()
    assert log.getvalue().splitlines() == progress_lines(log.getvalue())
    assert steps_of(progress_lines(log.getvalue()))[-1] == 20


PTY_SCRIPT = r"""
import sys
import runner.training.output as logs
from runner.training.progress import for_rank

logs.redirect_output(sys.argv[1], echo=True)
bar = for_rank(int(sys.argv[2]), 40, "train")
for i in range(40):
    if i == 20:
        print("halfway line", flush=True)
    bar.update(loss=0.25, samples=8)
bar.close()
print("after the bar", flush=True)
"""


def on_a_pseudo_terminal(tmp_path: Path, rank: int, columns: int = 0) -> tuple[str, str]:
    """What a process that echoes to a pseudo-terminal (as rank 0 of `run` in a terminal) shows there,
    and what its log holds. ``columns``: the terminal's width (0: it does not say)."""
    log = tmp_path / f"rank{rank}.log"
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    proc = subprocess.Popen([sys.executable, "-c", PTY_SCRIPT, str(log), str(rank)], stdout=slave,
                            stderr=subprocess.PIPE, cwd=REPO)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # EIO: the child closed its side
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    return b"".join(chunks).decode().replace("\r\n", "\n"), log.read_text()


@pytest.mark.parametrize("columns", [100, 0])
def test_rank_0_on_a_terminal_draws_the_bar_there_and_prints_above_it(tmp_path, columns):
    shown, log = on_a_pseudo_terminal(tmp_path, 0, columns)
    final = shown[:shown.index("after the bar")].rstrip("\n").rsplit("\r", 1)[1]
    assert final.startswith("train: 100%|") and "40/40 [" in final and "samples/s, loss 0.25]" in final
    assert (columns or 80) - 1 <= len(final) <= (columns or 80)  # the terminal's width, or 80 where it says none
    assert not progress_lines(shown)  # no plain lines on a terminal that has the bar
    assert re.search(r"\r +\rhalfway line\n", shown)  # the bar cleared first, the line whole
    assert shown.endswith("after the bar\n")
    assert "\r" not in log and "█" not in log
    assert "halfway line\n" in log and log.endswith("after the bar\n")
    assert steps_of(progress_lines(log)) == [4, 8, 12, 16, 20, 24, 28, 32, 36, 40]


def test_another_rank_that_echoes_keeps_its_progress_in_its_log(tmp_path):
    shown, log = on_a_pseudo_terminal(tmp_path, 1)  # local rank 0 of a second host
    assert "halfway line" in shown and "\r" not in shown and "progress" not in shown
    assert steps_of(progress_lines(log)) == [4, 8, 12, 16, 20, 24, 28, 32, 36, 40]


# ------------------------------------------------------------------------------ real runs


def test_rank_0_shows_plain_lines_on_a_terminal_that_is_not_a_tty_and_each_rank_logs_its_own(tmp_path):
    done = run("topology=1x2", "recipe=custom", "recipe.target=workloads.progress:main", "+recipe.steps=50",
               "recipe.global_batch_size=32", cwd=tmp_path)
    assert done.code == 0, done.output
    shown = progress_lines(done.stdout)
    assert steps_of(shown) == list(range(5, 51, 5))
    assert all(LINE.match(line).group(1) == "work" and "samples/s" in line and "elapsed" in line for line in shown)
    assert all("loss 100 " in line for line in shown)  # rank 0's, never rank 1's
    assert "halfway: step 25" in done.stdout
    folder = run_folder(tmp_path)
    rank0 = (folder / "logs" / "rank00000.log").read_text()
    rank1 = (folder / "logs" / "rank00001.log").read_text()
    assert progress_lines(rank0) == shown and "\r" not in rank0
    mine = progress_lines(rank1)
    assert steps_of(mine) == list(range(5, 51, 5)) and all("loss 101 " in line for line in mine)
    assert shown[-1].startswith("progress: work step 50/50 (100%) · ") and "eta" not in shown[-1]


def test_the_digits_recipe_shows_its_steps_and_a_resumed_run_starts_at_its_step(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    done = run("recipe.epochs=2", cwd=first, timeout=300)
    assert done.code == 0, done.output
    shown = progress_lines(done.stdout)  # 21 steps per epoch at the default global batch of 64
    assert steps_of(shown) == [5, 10, 15, 20, 25, 30, 35, 40, 42]
    assert all(LINE.match(line).group(3) == "42" for line in shown)
    assert "step 42: epoch=2 " in done.stdout and "final test accuracy: " in done.stdout  # what was there stays
    assert "\r" not in (run_folder(first) / "logs" / "rank00000.log").read_text()
    assert steps_of(progress_lines((run_folder(first) / "logs" / "rank00001.log").read_text()))[-1] == 42
    rows = [json.loads(line) for line in (run_folder(first) / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["final"] is True and rows[-1]["steps"] == 42

    checkpoint = run_folder(first) / "checkpoints" / "last.pt"
    done = run("recipe.epochs=4", f"recipe.resume={checkpoint}", cwd=second, timeout=300)
    assert done.code == 0, done.output
    shown = progress_lines(done.stdout)
    assert steps_of(shown) == [45, 54, 63, 72, 81, 84]  # from step 42 of 84, a line at every ninth step
    assert shown[0].startswith("progress: train step 45/84 (53%) · ")
    assert shown[-1].startswith("progress: train step 84/84 (100%) · ")

