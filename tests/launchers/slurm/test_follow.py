"""runner.launchers.slurm.follow: following a Slurm job: its output every second, its state on a schedule that backs
off, and the signals `run` gets passed on to it. Slurm's commands and the clock are fakes: pure logic. What Slurm
says of a job: test_job_slurm.py."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from runner.launchers.slurm.follow import JobFollower, PollSchedule
from runner.launchers.slurm.job import SlurmStates, ask_to_stop
from slurm_fakes import Clock, Slurm, Terminal, ok

pytestmark = pytest.mark.unit


@pytest.fixture
def slurm() -> Slurm:
    return Slurm(Clock())


def test_the_state_is_asked_every_second_then_a_tenth_of_the_time_in_it_at_most_every_30_s() -> None:
    schedule, asked, now = PollSchedule(), [], 0.0
    while now < 600:
        assert schedule.due(now)
        asked.append(now)
        schedule.asked(now, changed=not asked[:-1])  # the first answer, then the same state
        now = schedule.next_at
    gaps = [b - a for a, b in zip(asked, asked[1:])]
    assert asked[:11] == [float(t) for t in range(11)]  # every second for the first 10 s
    assert gaps == pytest.approx([min(30.0, max(1.0, 0.1 * a)) for a in asked[:-1]])
    assert gaps[-1] == pytest.approx(30.0) and len(asked) == 56  # in 600 s, not 600


def test_a_change_of_state_brings_the_polls_back_to_every_second() -> None:
    schedule = PollSchedule()
    schedule.asked(0.0, changed=True)
    schedule.asked(400.0, changed=False)
    assert schedule.next_at == 430.0  # 30 s: the longest
    schedule.asked(430.0, changed=True)
    assert schedule.next_at == 431.0
    schedule.asked(431.0, changed=False)
    schedule.hurry(431.5)  # cancelled: its end is near
    assert schedule.next_at == 432.0 and not schedule.due(431.9) and schedule.due(432.0)


def test_following_a_job_shows_its_output_every_second_while_its_state_is_asked_less_often(slurm, tmp_path) -> None:
    output = tmp_path / "slurm-77.out"
    slurm.answers["sacct"] = lambda: ok(f"77|{'RUNNING' if slurm.clock.now < 600 else 'COMPLETED'}|0:0|node1|None\n")
    clock = slurm.clock

    def sleep(seconds: float) -> None:  # the job writes a line as time passes
        clock.sleep(seconds)
        with open(output, "a") as f:
            f.write(f"at {clock.now:.2f}\n")

    terminal = Terminal(clock)
    follower = JobFollower("77", output, SlurmStates(slurm, clock), clock, sleep, terminal)
    last = follower.last_state()
    assert (last.job, last.state) == ("77", "COMPLETED")
    asked = slurm.times("sacct")
    assert asked[:11] == pytest.approx(range(11)) and len(asked) == 57  # over 609 s, not 609
    assert max(b - a for a, b in zip(asked, asked[1:])) == pytest.approx(30.0)
    assert 600 <= asked[-1] <= 630  # its end seen within the longest interval
    shown = [t for t, _ in terminal.writes]
    assert max(b - a for a, b in zip(shown, shown[1:])) <= 1.0 + 1e-9  # output every second, throughout
    assert "".join(text for _, text in terminal.writes) == output.read_text()  # all of it, the last line too
    assert slurm.times("scontrol") == []


def test_a_cancelled_job_is_asked_about_a_second_later(slurm, tmp_path) -> None:
    slurm.answers["sacct"] = lambda: ok(f"78|{'RUNNING' if not cancelled else 'CANCELLED'}|0:0|node1|None\n")
    cancelled: list[list[str]] = []
    clock = slurm.clock
    follower = JobFollower("78", tmp_path / "none.out", SlurmStates(slurm, clock), clock, clock.sleep,
                           Terminal(clock), cancel=cancelled.append)

    at: list[float] = []

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if clock.now >= 500 and not at:
            at.append(clock.now)
            follower.on_signal(signal.SIGINT)  # Ctrl-C at 500 s, while polls are 30 s apart

    follower._sleep = sleep
    assert follower.last_state().state == "CANCELLED"
    assert cancelled == [["78"]] and follower.stopping == [signal.SIGINT]
    assert slurm.times("sacct")[-2] < at[0] and slurm.times("sacct")[-1] == pytest.approx(at[0] + 1.0)


def _scancel(slurm: Slurm, pending: list[bool]):
    """scancel on the fake Slurm: ``--state=PENDING`` cancels the job while ``pending[0]``; a signal to a job that
    was cancelled is refused, as Slurm refuses it."""
    def answer() -> subprocess.CompletedProcess:
        argv = slurm.calls[-1][1]
        if "--state=PENDING" in argv and pending[0]:
            pending[0] = False
            pending.append(True)  # cancelled
        if any(a.startswith("--signal=") for a in argv) and len(pending) > 1:
            return subprocess.CompletedProcess([], 1, "", f"scancel: error: Kill job error on job id {argv[-1]}: Job "
                                                          f"can not be altered now, try again later\n")
        return ok("")
    return answer


def _follower(slurm: Slurm, job_id: str, folder, stop_signal: int, signals: dict[float, tuple[int, ...]],
              **kw) -> tuple[JobFollower, list[list[str]], list[float]]:
    """A follower of the fake Slurm's job, the jobs it cancelled, and when signals were sent: its sleep sends this
    process ``signals`` once their times have come, as to `run` (the handlers under test catch them)."""
    clock, cancelled, sent = slurm.clock, [], []

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        for at in sorted(t for t in signals if t <= clock.now):
            sent.append(clock.now)
            for sig in signals.pop(at):
                os.kill(os.getpid(), sig)

    follower = JobFollower(job_id, folder / "none.out", SlurmStates(slurm, clock), clock, sleep, Terminal(clock),
                           cancel=cancelled.append, stop_signal=stop_signal, user_stop=folder / "user_stop",
                           stop=lambda ids, signum: ask_to_stop(ids, signum, slurm), **kw)
    return follower, cancelled, sent


def _scancels(slurm: Slurm) -> list[list[str]]:
    return [argv for _, argv in slurm.calls if argv[0] == "scancel"]


def test_the_stop_signal_is_passed_on_to_the_batch_script_and_the_job_followed_to_its_end(slurm, tmp_path, capsys):
    """kill -USR1 <pid of run> while it follows a job: the marker, then scancel --signal=USR1 --batch (each time);
    `run` follows the job on (asked again a second later) and returns its own exit status: 0, the ranks returned."""
    clock = slurm.clock
    slurm.answers["sacct"] = lambda: ok(f"79|{'COMPLETED' if clock.now > 520 else 'RUNNING'}|0:0|node1|None\n")
    slurm.answers["scancel"] = _scancel(slurm, [False])
    follower, cancelled, sent = _follower(slurm, "79", tmp_path, signal.SIGUSR1, {500: (signal.SIGUSR1,),
                                                                                 505: (signal.SIGUSR1,)})
    assert follower.exit_status() == 0
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # put back
    assert _scancels(slurm) == [["scancel", "--state=PENDING", "79"], ["scancel", "--signal=USR1", "--batch", "79"]] * 2
    assert follower.asked == [signal.SIGUSR1] * 2 and not follower.stopping and not cancelled
    assert "SIGUSR1 to `run`" in (tmp_path / "user_stop").read_text()
    asked = slurm.times("sacct")
    assert next(t for t in asked if t > sent[0]) == pytest.approx(sent[0] + 1.0)  # 30 s apart before: 1 s later
    assert 520 < asked[-1] <= 525  # its end seen soon
    err = capsys.readouterr().err
    assert err.count("SIGUSR1: asking Slurm job 79 to checkpoint and stop (scancel --signal=USR1 --batch 79), then "
                     "following to the end (Ctrl-C cancels)") == 2
    assert "cancelling" not in err


def test_after_a_stop_ctrl_c_still_cancels_and_a_stop_after_a_cancel_is_not_passed_on(slurm, tmp_path) -> None:
    slurm.answers["scancel"] = ok("")
    follower, cancelled, _ = _follower(slurm, "80", tmp_path, signal.SIGUSR1, {10: (signal.SIGUSR1,),
                                                                              20: (signal.SIGINT, signal.SIGUSR1)})
    slurm.answers["sacct"] = lambda: ok(f"80|{'CANCELLED' if cancelled else 'RUNNING'}|0:0|node1|None\n")
    assert follower.exit_status() == 130  # 128 + SIGINT, as before
    assert cancelled == [["80"]] and follower.asked == [signal.SIGUSR1]
    assert len(_scancels(slurm)) == 2  # one stop passed on: the pending jobs' cancel, the signal


def test_a_stop_before_the_job_started_cancels_it(slurm, tmp_path, capsys) -> None:
    """Slurm signals no pending job, and it has nothing to checkpoint: it is cancelled (only while pending), and
    `run` says it stopped by the signal."""
    pending = [True]
    slurm.answers["sacct"] = lambda: ok(f"81|{'PENDING' if pending[0] else 'CANCELLED'}|0:0|None assigned|Priority\n")
    slurm.answers["scancel"] = _scancel(slurm, pending)
    follower, cancelled, _ = _follower(slurm, "81", tmp_path, signal.SIGUSR2, {3: (signal.SIGUSR2,)})
    assert follower.exit_status() == 128 + signal.SIGUSR2 and not cancelled
    err = capsys.readouterr().err
    assert "SIGUSR2: Slurm did not pass it on: scancel: error: Kill job error on job id 81: Job can not be altered " \
           "now" in err
    assert "slurm job 81 ended CANCELLED after SIGUSR2 (a job that had not started is cancelled: nothing to " \
           "checkpoint)" in err


def test_a_stop_signal_that_is_sigterm_cancels(slurm, tmp_path) -> None:
    """launcher.slurm.signal=TERM: SIGTERM to `run` still means cancel (the one meaning it can have)."""
    follower, cancelled, _ = _follower(slurm, "82", tmp_path, signal.SIGTERM, {3: (signal.SIGTERM,)})
    slurm.answers["sacct"] = lambda: ok(f"82|{'CANCELLED' if cancelled else 'RUNNING'}|0:0|node1|None\n")
    assert follower.exit_status() == 143
    assert cancelled == [["82"]] and not follower.asked and not (tmp_path / "user_stop").exists()
