"""Progress (runner/progress.py, ctx.progress): plain lines at every tenth and at the end, with steps,
throughput, smoothed loss, elapsed and ETA; a live bar on a TTY that never reaches the log; rank 0's
terminal and every rank's own log in real runs."""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

import pytest

from clocks import Clock
from runner.common.formatting import duration
from runner.training.progress import Progress
from runs import run, run_folder

LINE = re.compile(r"^progress: (?:(\w+) )?step (\d+)(?:/(\d+) \((\d+)%\))?")


def progress_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("progress: ")]


def steps_of(lines: list[str]) -> list[int]:
    return [int(LINE.match(line).group(2)) for line in lines]


# ------------------------------------------------------------------------------ plain lines, no processes


@pytest.mark.unit
def test_a_line_at_every_tenth_with_throughput_loss_elapsed_and_eta():
    clock, log = Clock(1000.0), io.StringIO()
    bar = Progress(20, "train", lines=[log], clock=clock)
    for _ in range(20):
        clock.now += 0.5
        bar.update(loss=0.5, samples=64)
    bar.close()
    lines = progress_lines(log.getvalue())
    assert steps_of(lines) == [2, 4, 6, 8, 10, 12, 14, 16, 18, 20]  # the last mark is the end: no line twice
    assert lines[1] == "progress: train step 4/20 (20%) · 128 samples/s · loss 0.5 · 2.0 s elapsed, eta 8.0 s"
    assert lines[-1] == "progress: train step 20/20 (100%) · 128 samples/s · loss 0.5 · 10.0 s elapsed"


@pytest.mark.unit
def test_a_resumed_run_counts_only_its_own_steps_for_throughput_and_eta():
    clock, log = Clock(1000.0), io.StringIO()
    with Progress(100, initial=60, lines=[log], clock=clock) as bar:
        for _ in range(40):
            clock.now += 1.0
            bar.update(samples=10)
    lines = progress_lines(log.getvalue())
    assert steps_of(lines) == [70, 80, 90, 100]
    assert lines[0] == "progress: step 70/100 (70%) · 10 samples/s · 10.0 s elapsed, eta 30.0 s"


@pytest.mark.unit
def test_closing_early_says_where_it_stopped_once():
    clock, log = Clock(1000.0), io.StringIO()
    bar = Progress(20, "train", lines=[log], clock=clock)
    for _ in range(7):
        clock.now += 1.0
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
    clock, log = Clock(1000.0), io.StringIO()
    bar = Progress(None, lines=[log], interval_s=5.0, clock=clock)
    for _ in range(12):
        clock.now += 1.0
        bar.update()
    bar.close()
    assert progress_lines(log.getvalue()) == ["progress: step 5 · 5.0 s elapsed", "progress: step 10 · 10.0 s elapsed",
                                              "progress: step 12 · 12.0 s elapsed"]


@pytest.mark.unit
def test_a_slow_run_gets_a_line_between_tenths_once_the_interval_passed():
    clock, log = Clock(1000.0), io.StringIO()
    bar = Progress(1000, lines=[log], interval_s=30.0, clock=clock)
    for _ in range(50):
        clock.now += 1.0
        bar.update()
    assert steps_of(progress_lines(log.getvalue())) == [30]  # no tenth yet (100 steps), one line for liveness


@pytest.mark.unit
def test_the_loss_shown_is_smoothed():
    bar = Progress(10, lines=[io.StringIO()], clock=Clock(1000.0))
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


@pytest.mark.unit
def test_the_bars_state_goes_to_its_sink_at_most_every_tenth_of_a_second_and_at_the_close():
    """A rank does not draw its bar: it sends the state to its host agent, which draws it (runner.worker.relay).
    The log gets the plain lines."""
    clock, log, states = Clock(1000.0), io.StringIO(), []
    with Progress(20, "train", bar=states.append, lines=[log], clock=clock) as bar:
        for _ in range(20):
            clock.now += 1 / 32
            bar.update(loss=0.5, samples=64)
    assert [s["n"] for s in states] == [1, 5, 9, 13, 17, 20]  # every 0.1 s of the clock at most, then the close
    assert [s["closed"] for s in states] == [False] * 5 + [True]
    last = states[-1]
    assert (last["k"], last["total"], last["desc"], last["initial"]) == ("bar", 20, "train", 0)
    assert last["elapsed"] == 0.625 and last["postfix"] == "2048 samples/s, loss 0.5"
    assert steps_of(progress_lines(log.getvalue())) == [2, 4, 6, 8, 10, 12, 14, 16, 18, 20]


# the pseudo-terminal's side of `run`: it passes on Ctrl-\ (runs.Started asks so where the ranks are) and `run` dies
# with it (PR_SET_PDEATHSIG), and it copies what the terminal shows as it comes
PTY_RUN = r"""
import ctypes, os, signal, subprocess, sys, fcntl, struct, termios
master, slave = os.openpty()
fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, int(sys.argv[1]), 0, 0))
proc = subprocess.Popen(sys.argv[2:], stdout=slave, stderr=slave, stdin=subprocess.DEVNULL,
                        preexec_fn=lambda: ctypes.CDLL(None).prctl(1, signal.SIGKILL))
signal.signal(signal.SIGQUIT, lambda sig, _frame: proc.send_signal(sig))
os.close(slave)
while True:
    try:
        chunk = os.read(master, 1 << 16)
    except OSError:  # EIO: every writer closed its side
        break
    if not chunk:
        break
    sys.stdout.buffer.write(chunk)
    sys.stdout.buffer.flush()
sys.exit(proc.wait())
"""


def on_a_pseudo_terminal(tmp_path: Path, columns: int, *overrides: str) -> tuple[int, str]:
    """`run` with its stdout and stderr on a pseudo-terminal (as in a terminal), ``columns`` wide (0: it does not
    say): its exit status and what the terminal showed."""
    done = run(*overrides, run_id=f"t{columns}", cwd=tmp_path, prefix=(sys.executable, "-c", PTY_RUN, str(columns)),
               newline="")
    return done.code, done.stdout.replace("\r\n", "\n")


@pytest.mark.parametrize("columns", [100, 0])
def test_rank_0_on_a_terminal_gets_a_live_bar_and_printed_lines_go_above_it(tmp_path, columns):
    code, shown = on_a_pseudo_terminal(tmp_path, columns, "topology=1x2", "recipe=custom",
                                       "recipe.target=workloads.progress:main", "+recipe.steps=40",
                                       "+recipe.step_s=0.02", "recipe.global_batch_size=32")
    assert code == 0, shown
    before = shown[:shown.index("halfway: step 20")]
    assert before.endswith("\r\x1b[K")  # the bar was cleared before the line was written
    after_close = shown[:shown.index("== run ")]
    final = after_close.rstrip("\n").rsplit("\r", 1)[1].removesuffix("\x1b[K")
    assert final.startswith("work: 100%|") and "40/40 [" in final and "samples/s, loss 100]" in final
    assert (columns or 80) - 1 <= len(final) <= (columns or 80)  # the terminal's width, or 80 where it says none
    assert not progress_lines(shown)  # no plain lines on a terminal that has the bar
    log = (run_folder(tmp_path) / "logs" / "rank00000.log").read_text()
    assert "\r" not in log and "█" not in log and "halfway: step 20" in log
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



def test_the_step_count_knows_the_bars_step_and_where_the_first_bar_began() -> None:
    """What a rank's watch tells its agent (runner.worker.rank_life): a resumed attempt began at 30, is now at 33."""
    from runner.training.progress import StepCount

    steps = StepCount()
    assert (steps.taken, steps.position, steps.resumed) == (0, None, None)
    bar = Progress(100, "train", initial=30, steps=steps)
    assert (steps.position, steps.resumed) == (30, 30)
    bar.update(2)
    bar.update()
    assert (steps.taken, steps.position, steps.resumed) == (3, 33, 30)
    Progress(10, "eval", steps=steps).update(4)  # a second bar: its step, the first bar's beginning
    assert (steps.taken, steps.position, steps.resumed) == (7, 4, 30)
