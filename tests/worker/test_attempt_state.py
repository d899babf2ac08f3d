"""runner.worker.attempt_state: one attempt of a host's share as a state machine. Each test sends events to the one
handler and reads the phase it moved to, the record of how the ranks ended, and the directives for the agent (the
agent that carries them out against real ranks: tests/launchers/test_local_launcher.py, tests/e2e)."""

from __future__ import annotations

import signal

import pytest

from runner.worker.attempt_state import (FAILURE_STOP_S, AnswerForTheSilent, AttemptState, DiagnoseStall,
                                         DumpsAnswered, DumpsRequested, EndedFromOutside, FirstFailureWas, PeerFailed,
                                         Phase, RankExited, ReportBegan, Say, SayWhereTheRanksAre, SayWhereTheyWere,
                                         Send, Signalled, StallSeen, Stalled, Started, StopSeen, StuckAtEnd,
                                         TellFailure, TellOwnFailure, TellStop, Tick, TimedOut, WhereAsked)
from runner.worker.channel_records import JobFailure, StopAsked
from runner.worker.rank_life import STACKS_S, Stuck
from runner.worker.rank_process import STACK_SIGNAL

pytestmark = pytest.mark.unit

T0 = 1000.0  # the monotonic clock when the events come


def host_b(*, scripts: bool = False, grace_s: float = 10.0) -> AttemptState:
    """Host b's attempt: ranks 2 and 3 running a recipe (or a script), stop signal SIGUSR1."""
    return AttemptState(ranks=(2, 3), scripts=scripts, stop_signal=signal.SIGUSR1, grace_s=grace_s)


def exited(rank: int, code: int, at: float = 50.0) -> RankExited:
    return RankExited(rank=rank, code=code, at=at)


PEER = JobFailure(rank=0, host="a", text="RuntimeError: boom")


# -------------------------------------------------------------------------- ranks that end by themselves


def test_ranks_that_all_exit_well_end_the_attempt_with_nothing_to_do() -> None:
    state = host_b()
    assert state.handle(exited(3, 0, at=51.0), T0) == [] and state.phase is Phase.RUNNING
    assert state.handle(exited(2, 0, at=52.0), T0) == [] and state.phase is Phase.ENDED
    ending = state.ending
    assert (ending.codes, ending.order, ending.ended_at) == ({2: 0, 3: 0}, [3, 2], {3: 51.0, 2: 52.0})
    assert not ending.failed


def test_a_host_with_no_ranks_has_ended_before_it_starts() -> None:
    assert AttemptState(ranks=(), scripts=False, stop_signal=signal.SIGUSR1, grace_s=1.0).phase is Phase.ENDED


def test_the_same_exit_seen_twice_counts_once() -> None:
    state = host_b()
    state.handle(exited(3, 1), T0)
    assert state.handle(exited(3, 1), T0 + 1) == [] and state.ending.order == [3]


def test_a_rank_that_failed_by_itself_stops_the_others_tells_the_job_and_sets_the_deadline() -> None:
    state = host_b()
    said = state.handle(exited(3, 1), T0)
    assert said == [TellOwnFailure(rank=3), Send(signum=signal.SIGTERM, ranks=(2,))]
    assert (state.phase, state.deadline, state.ending.stopped) == (Phase.STOPPING, T0 + FAILURE_STOP_S, {2})
    assert state.ending.first_failure() == 3
    assert state.handle(exited(2, -signal.SIGTERM), T0 + 1) == [] and state.phase is Phase.ENDED
    assert state.ending.failed_by_itself() and state.ending.first_failure() == 3  # rank 2 was stopped


def test_the_last_rank_failing_still_tells_the_job() -> None:
    state = host_b()
    state.handle(exited(2, 0), T0)
    assert state.handle(exited(3, -signal.SIGKILL), T0) == [TellOwnFailure(rank=3)]
    assert state.phase is Phase.ENDED


def test_the_ranks_still_running_at_the_deadline_are_killed_with_their_process_groups() -> None:
    state = host_b()
    state.handle(exited(3, 1), T0)
    assert state.handle(Tick(), T0 + FAILURE_STOP_S - 0.1) == []
    assert state.handle(Tick(), T0 + FAILURE_STOP_S) == [Send(signum=signal.SIGKILL, ranks=(2, 3), group=True)]
    assert state.phase is Phase.KILLED and state.deadline is None
    assert state.handle(Tick(), T0 + 60) == []  # killed once
    state.handle(exited(2, -signal.SIGKILL), T0 + 60)
    assert state.phase is Phase.ENDED and state.ending.stopped == {2}  # this agent's SIGKILL: a rank stopped


def test_a_rank_killed_from_outside_whose_exit_is_seen_after_a_peers_failure_is_no_rank_stopped() -> None:
    """Rank 2 killed (SIGKILL from outside) and rank 3 failing on its closed connection: rank 3's exit seen first,
    the agent stops rank 2, whose exit then says SIGKILL, which this agent never sent: rank 2 failed by itself too (the
    report names it, the cause, before the rank that lost it: runner.worker.failures.choose_first)."""
    state = host_b()
    state.handle(exited(3, 1), T0)
    assert state.ending.stopped == {2}
    state.handle(exited(2, -signal.SIGKILL), T0 + 0.01)
    assert state.ending.stopped == set() and state.ending.order == [3, 2] and state.phase is Phase.ENDED


def test_the_channel_naming_another_hosts_failure_first_makes_it_the_earlier_one() -> None:
    state = host_b()
    state.handle(exited(3, 1), T0)
    assert state.handle(FirstFailureWas(failure=PEER), T0) == []
    assert state.ending.earlier == PEER and state.ending.peer_failed is None
    again = host_b()
    again.handle(exited(3, 1), T0)
    again.handle(FirstFailureWas(failure=JobFailure(rank=3, host="b", text="boom")), T0)  # its own: no earlier
    assert again.ending.earlier is None


# -------------------------------------------------------------------------- causes from elsewhere


def test_another_hosts_failure_stops_this_hosts_ranks_and_is_the_attempts_cause() -> None:
    state = host_b()
    state.handle(exited(3, 0), T0)
    assert state.handle(PeerFailed(failure=PEER), T0) == [Send(signum=signal.SIGTERM, ranks=(2,))]
    assert (state.phase, state.deadline, state.ending.peer_failed) == (Phase.STOPPING, T0 + FAILURE_STOP_S, PEER)
    assert state.handle(PeerFailed(failure=JobFailure(rank=1, host="a", text="later")), T0 + 1) == []  # stopping
    assert state.ending.peer_failed == PEER


def test_the_job_ended_from_outside_is_told_on_the_channel_and_the_channels_first_failure_wins() -> None:
    lost = JobFailure(rank=None, host="c", text="ssh: connection to c lost")
    state = host_b()
    assert state.handle(EndedFromOutside(failure=lost), T0) == [TellFailure(failure=lost, read_back=True),
                                                                Send(signum=signal.SIGTERM, ranks=(2, 3))]
    assert state.ending.peer_failed == lost and state.phase is Phase.STOPPING
    state.handle(FirstFailureWas(failure=PEER), T0)  # a rank had failed before the host was lost
    assert state.ending.peer_failed == PEER and state.ending.earlier is None


def test_a_stall_is_told_on_the_channel_and_fails_the_attempt() -> None:
    stall = JobFailure(rank=None, host="b", text="stall: no rank completed a collective", stall=True)
    state = host_b()
    assert state.handle(Stalled(failure=stall), T0) == [TellFailure(failure=stall, read_back=False),
                                                        Send(signum=signal.SIGTERM, ranks=(2, 3))]
    assert state.ending.peer_failed == stall and state.deadline == T0 + FAILURE_STOP_S


def test_a_rank_stuck_at_its_end_writes_its_stacks_and_is_killed_a_moment_later_while_the_attempt_runs() -> None:
    stuck = Stuck(index=1, text="rank 3 finished its work but did not end", work_done=True)
    state = host_b()
    assert state.handle(StuckAtEnd(rank=3, stuck=stuck, stacks="logs/rank00003.log"), T0) == [
        Say(text="\nrank 3 finished its work but did not end (its stacks: logs/rank00003.log)"),
        Send(signum=STACK_SIGNAL, ranks=(3,))]
    assert state.ending.stuck == {3: stuck} and state.phase is Phase.RUNNING
    assert state.handle(Tick(), T0 + STACKS_S) == [Send(signum=signal.SIGKILL, ranks=(3,), group=True)]
    assert state.handle(Tick(), T0 + STACKS_S + 1) == []
    state.handle(exited(3, -signal.SIGKILL), T0 + 2)
    assert not state.ending.failed_by_itself()  # its work was done: the end guard's kill is no failure
    assert state.phase is Phase.RUNNING


# -------------------------------------------------------------------------- signals


def test_ctrl_c_stops_the_running_ranks_with_sigint_and_kills_them_after_the_grace() -> None:
    state = host_b()
    state.handle(exited(3, 0), T0)
    assert state.handle(Signalled(signum=signal.SIGINT), T0) == [Say(text="\nSIGINT: stopping 1 process(es)"),
                                                               Send(signum=signal.SIGINT, ranks=(2,)),
                                                               TellStop(signum=signal.SIGINT)]
    assert (state.phase, state.deadline, state.ending.signum, state.ending.stopped) == (
        Phase.STOPPING, T0 + 10.0, signal.SIGINT, {2})
    # `run` passes Ctrl-C on too: once is enough for the ranks (the job's channel hears every signal, as it came)
    assert state.handle(Signalled(signum=signal.SIGTERM), T0 + 1) == [TellStop(signum=signal.SIGTERM)]
    assert state.handle(Tick(), T0 + 10.0) == [SayWhereTheyWere(signum=signal.SIGINT),
                                               Send(signum=signal.SIGKILL, ranks=(2, 3), group=True)]


def test_sigterm_asks_a_recipe_to_checkpoint_and_stop_and_keeps_an_earlier_deadline() -> None:
    state = host_b()
    state.handle(exited(3, 1), T0)  # a failure: the others have FAILURE_STOP_S
    assert state.handle(Signalled(signum=signal.SIGTERM), T0 + 1) == [
        Say(text="\nSIGTERM: asking 1 process(es) to checkpoint and stop (the stop request; launcher.grace_s=10)"),
        Send(signum=signal.SIGUSR1, ranks=(2,)), TellStop(signum=signal.SIGTERM)]
    assert state.deadline == T0 + FAILURE_STOP_S and state.ending.signum == signal.SIGTERM
    fresh = host_b()
    assert fresh.handle(Signalled(signum=signal.SIGTERM), T0)[1] == Send(signum=signal.SIGUSR1, ranks=(2, 3))
    assert fresh.deadline == T0 + 10.0


def test_sigterm_from_another_hosts_run_reaches_a_script_as_sigterm() -> None:
    state = host_b(scripts=True)
    assert state.handle(Signalled(signum=signal.SIGTERM, origin="a"), T0) == [
        Say(text="\nSIGTERM (to a's `run`): stopping 2 process(es)"), Send(signum=signal.SIGTERM, ranks=(2, 3))]


def test_the_stop_signal_asks_a_recipe_once_and_neither_stops_nor_times_its_ranks() -> None:
    state = host_b()
    assert state.handle(Signalled(signum=signal.SIGUSR1), T0) == [
        Say(text="\nSIGUSR1: asking 2 process(es) to checkpoint and stop"), Send(signum=signal.SIGUSR1, ranks=(2, 3)),
        TellStop(signum=signal.SIGUSR1)]
    assert (state.phase, state.deadline, state.ending.requested, state.ending.stopped, state.ending.signum) == (
        Phase.RUNNING, None, True, set(), None)
    assert state.handle(Signalled(signum=signal.SIGUSR1, origin="a"), T0) == []  # the same request, from the channel
    state.handle(exited(2, 0), T0)
    state.handle(exited(3, 0), T0)
    assert state.phase is Phase.ENDED and not state.ending.failed


def test_the_stop_signal_reaches_a_script_as_the_sigterm_it_traps_and_marks_it_stopped() -> None:
    state = host_b(scripts=True)
    said = state.handle(Signalled(signum=signal.SIGUSR1), T0)
    assert said == [Say(text="\nSIGUSR1: asking 2 process(es) to checkpoint and stop (SIGTERM to the script)"),
                    Send(signum=signal.SIGTERM, ranks=(2, 3)), TellStop(signum=signal.SIGUSR1)]
    assert state.ending.stopped == {2, 3} and state.phase is Phase.RUNNING
    state.handle(exited(2, -signal.SIGTERM), T0)
    assert not state.ending.failed_by_itself() and state.phase is Phase.RUNNING  # it asked for that end


def test_a_signal_after_the_ranks_were_killed_is_still_the_attempts_end() -> None:
    """A Ctrl-C while a failed attempt's ranks are being killed: no restart after it (the agent reads signum)."""
    state = host_b()
    state.handle(exited(3, 1), T0)
    state.handle(Tick(), T0 + FAILURE_STOP_S)
    assert state.handle(Signalled(signum=signal.SIGINT), T0 + 6) == [Say(text="\nSIGINT: stopping 1 process(es)"),
                                                                    Send(signum=signal.SIGINT, ranks=(2,)),
                                                                    TellStop(signum=signal.SIGINT)]
    assert state.phase is Phase.KILLED and state.ending.signum == signal.SIGINT


def test_a_failure_from_elsewhere_after_a_stop_changes_nothing() -> None:
    state = host_b()
    state.handle(Signalled(signum=signal.SIGINT), T0)
    assert state.handle(PeerFailed(failure=PEER), T0) == [] and state.ending.peer_failed is None
    assert state.handle(EndedFromOutside(failure=PEER), T0) == []


# -------------------------------------------------------------------------- what the attempt remembers


def test_a_stop_request_read_on_the_channel_is_remembered_and_this_hosts_own_is_read_back() -> None:
    state = host_b()
    theirs = StopAsked(signal=signal.SIGUSR1, host="a", time=5.0)
    assert state.handle(Signalled(signum=signal.SIGUSR1, origin="a", asked=theirs), T0)[-1] == \
        Send(signum=signal.SIGUSR1, ranks=(2, 3))  # another host's: not told again
    assert state.stop_seen == theirs
    ours = StopAsked(signal=signal.SIGINT, host="b", time=6.0)
    assert state.handle(StopSeen(asked=ours), T0) == [] and state.stop_seen == ours


def test_a_stall_is_diagnosed_first_and_only_while_the_attempt_runs() -> None:
    state = host_b()
    assert state.handle(StallSeen(quiet_s=65.0), T0) == [DiagnoseStall(quiet_s=65.0)]
    assert state.phase is Phase.RUNNING  # the diagnosis comes back as Stalled
    state.handle(Signalled(signum=signal.SIGINT), T0)
    assert state.handle(StallSeen(quiet_s=66.0), T0) == []


def test_after_a_collective_timed_out_the_ranks_still_running_are_asked_for_their_stacks_once() -> None:
    state = host_b()
    assert state.handle(TimedOut(running=(3,)), T0) == [Send(signum=STACK_SIGNAL, ranks=(3,))]
    assert state.stacks_asked and state.handle(TimedOut(running=(3,)), T0 + 1) == []


def test_a_timeout_with_no_rank_left_running_asks_nothing_and_one_while_stopping_is_not_taken() -> None:
    state = host_b()
    assert state.handle(TimedOut(running=()), T0) == [] and state.stacks_asked
    stopping = host_b()
    stopping.handle(exited(3, 1), T0)
    assert stopping.handle(TimedOut(running=(2,)), T0) == [] and not stopping.stacks_asked


def test_a_request_for_dumps_is_answered_for_the_silent_once_and_not_one_the_agent_asked_itself() -> None:
    state = host_b()
    assert state.handle(DumpsRequested(at=100.0, reason="request"), T0) == [AnswerForTheSilent(at=100.0,
                                                                                               reason="request")]
    assert state.handle(DumpsRequested(at=100.0, reason="request"), T0 + 1) == []
    assert state.handle(DumpsAnswered(at=120.0), T0 + 2) == [] and state.answered == 120.0
    assert state.handle(DumpsRequested(at=120.0, reason="stall"), T0 + 3) == []
    assert state.handle(DumpsAnswered(at=110.0), T0 + 4) == [] and state.answered == 120.0  # never goes back


def test_an_earlier_attempts_answer_is_where_the_next_one_starts() -> None:
    state = AttemptState(ranks=(2, 3), scripts=False, stop_signal=signal.SIGUSR1, grace_s=1.0, answered=100.0)
    assert state.handle(DumpsRequested(at=100.0, reason="request"), T0) == []


def test_the_attempts_start_is_reported_and_where_the_ranks_are_is_said_when_asked_in_any_phase() -> None:
    state = host_b()
    assert state.handle(Started(), T0) == [ReportBegan()]
    assert state.handle(WhereAsked(), T0) == [SayWhereTheRanksAre()]
    state.handle(exited(3, 1), T0)
    assert state.handle(WhereAsked(), T0) == [SayWhereTheRanksAre()]
