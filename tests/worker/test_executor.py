"""runner.worker.executor: each directive of an attempt's state machine carried out, against made-up ranks, a real
job's channel in a folder (init=file), diagnostics and a reporter that record what they were asked; and the events
an effect's result makes for the machine."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

import pytest

from runner.records.paths import RunPaths
from runner.worker.agent_reports import AttemptBegan, StepReached
from runner.worker.attempt_state import (AnswerForTheSilent, AttemptState, DiagnoseStall, DumpsAnswered,
                                         FirstFailureWas, RankExited, ReportBegan, ReportStep, Say,
                                         SayWhereTheRanksAre, SayWhereTheyWere, Send, Stalled, StepSeen, StopSeen,
                                         TellFailure, TellOwnFailure, TellStop)
from runner.worker.channel import JobChannel
from runner.worker.channel_records import JobFailure
from runner.worker.executor import Executor
from runner.worker.running import Running
from test_running import running_of

pytestmark = pytest.mark.unit

STALL = JobFailure(rank=None, host="b", text="stall: no rank completed a collective", stall=True, time=3.0)


@dataclass
class Diagnostics:
    """runner.worker.diagnostics.Diagnostics's calls, recorded; what each returns, made up."""

    asked: list[tuple] = field(default_factory=list)
    left: bool = True

    def speak_for_the_silent(self, reason: str, asked: float) -> None:
        self.asked.append(("silent", reason, asked))

    def where_the_ranks_are(self) -> float | None:
        self.asked.append(("where",))
        return 50.0

    def stall(self, quiet_s: float) -> tuple[float, JobFailure]:
        self.asked.append(("stall", quiet_s))
        return 60.0, STALL

    def where_they_were(self, signum: int) -> tuple[float, str] | None:
        self.asked.append(("were", signum))
        return (70.0, "SIGINT: rank(s) 3 still running") if self.left else None


def executor_of(running: Running) -> tuple[Executor, AttemptState, Diagnostics, list[str], list[object]]:
    state = AttemptState(ranks=(2, 3), scripts=False, stop_signal=signal.SIGUSR1, grace_s=1.0)
    diagnostics, said, reports = Diagnostics(), [], []
    executor = Executor(running, state, diagnostics, reports.append, clock=lambda: 1700.0,  # type: ignore[arg-type]
                        say=said.append)
    return executor, state, diagnostics, said, reports


def attempt_channel(paths: RunPaths) -> JobChannel:
    channel = JobChannel.in_folder(paths.channel_folder(None))
    channel.open_attempt(0)
    return channel


def test_a_send_reaches_the_named_ranks_processes_and_a_say_the_agents_stderr(paths) -> None:
    running = running_of(paths)
    executor, _, _, said, _ = executor_of(running)
    assert executor.carry_out(Send(signum=signal.SIGKILL, ranks=(3,), group=True)) == []
    assert executor.carry_out(Say(text="\nSIGINT: stopping 2 process(es)")) == []
    assert [r.signalled for r in running.ranks] == [[], [(signal.SIGKILL, True)]]
    assert said == ["\nSIGINT: stopping 2 process(es)"]


def test_a_ranks_own_failure_is_told_on_the_channel_and_the_first_one_there_comes_back(paths) -> None:
    channel = attempt_channel(paths)
    earlier = JobFailure(rank=0, host="a", text="RuntimeError: boom", time=1.0)
    channel.say_failed(0, earlier)
    executor, state, _, _, _ = executor_of(running_of(paths, channel=channel))
    state.handle(RankExited(rank=3, code=1, at=5.0), 0.0)
    assert executor.carry_out(TellOwnFailure(rank=3)) == [FirstFailureWas(failure=earlier)]


def test_a_failure_is_told_on_the_channel_and_read_back_only_when_asked(paths) -> None:
    channel = attempt_channel(paths)
    executor, _, _, _, _ = executor_of(running_of(paths, channel=channel))
    assert executor.carry_out(TellFailure(failure=STALL, read_back=False)) == []
    assert channel.failure(0) == STALL
    assert executor.carry_out(TellFailure(failure=STALL, read_back=True)) == [FirstFailureWas(failure=STALL)]


def test_a_stop_is_told_on_the_channel_in_this_hosts_name_and_read_back(paths) -> None:
    channel = attempt_channel(paths)
    executor, _, _, _, _ = executor_of(running_of(paths, channel=channel))
    [seen] = executor.carry_out(TellStop(signum=signal.SIGTERM))
    assert isinstance(seen, StopSeen) and (seen.asked.signal, seen.asked.host) == (signal.SIGTERM, "b")
    assert channel.stop_requested() == seen.asked


def test_without_a_channel_nothing_is_told_and_nothing_comes_back(paths) -> None:
    executor, state, _, _, _ = executor_of(running_of(paths))
    state.handle(RankExited(rank=3, code=1, at=5.0), 0.0)
    assert executor.carry_out(TellOwnFailure(rank=3)) == []
    assert executor.carry_out(TellStop(signum=signal.SIGINT)) == []


def test_the_diagnostics_are_asked_and_when_they_asked_the_ranks_comes_back(paths) -> None:
    executor, _, diagnostics, said, _ = executor_of(running_of(paths))
    assert executor.carry_out(DiagnoseStall(quiet_s=65.0)) == [DumpsAnswered(at=60.0), Stalled(failure=STALL)]
    assert executor.carry_out(SayWhereTheRanksAre()) == [DumpsAnswered(at=50.0)]
    assert executor.carry_out(AnswerForTheSilent(at=40.0, reason="request")) == []
    assert executor.carry_out(SayWhereTheyWere(signum=signal.SIGINT)) == [DumpsAnswered(at=70.0)]
    diagnostics.left = False
    assert executor.carry_out(SayWhereTheyWere(signum=signal.SIGINT)) == []
    assert diagnostics.asked == [("stall", 65.0), ("where",), ("silent", "request", 40.0), ("were", signal.SIGINT),
                                 ("were", signal.SIGINT)]
    assert said == ["SIGINT: rank(s) 3 still running"]


def test_the_reports_go_to_whoever_started_the_agent_with_the_attempt(paths) -> None:
    executor, _, _, _, reports = executor_of(running_of(paths))
    executor.carry_out(ReportBegan())
    executor.carry_out(ReportStep(seen=StepSeen(step=41, resumed=40, copy_host="b", copy_save=7)))
    assert reports == [AttemptBegan(attempt=0, at=1700.0),
                       StepReached(attempt=0, step=41, resumed=40, at=1700.0, copy_host="b", copy_save=7)]
