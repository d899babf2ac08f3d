"""runner.worker.monitor: each source of an attempt's events reads (the zygote's exits, the agent's inbox, the job's
channel, the ranks' error files and lives) and returns events; none of them signals a rank, writes the channel or a
dump. Ranks, relay and clocks are made up; the job's channel is a real one in a folder (init=file)."""

from __future__ import annotations

import dataclasses
import signal

import pytest

from clocks import Clock
from conftest import make_spec
from runner.records.outcomes import ErrorRecord
from runner.records.paths import RunPaths
from runner.records.watch_files import request_dumps
from runner.worker.attempt_state import (AttemptState, DumpsRequested, EndedFromOutside, PeerFailed, RankExited,
                                         Signalled, StallSeen, StepSeen, StuckAtEnd, Tick, TimedOut, WhereAsked)
from runner.worker.channel import JobChannel
from runner.worker.channel_records import JobFailure
from runner.worker.inbox import AgentInbox
from runner.worker.monitor import PEER_POLL_S, Monitor
from runner.worker.process_state import Waiting
from runner.worker.rank_life import QUIET_S, STALL_MARGIN_S, EndGuard, RankLife
from runner.worker.running import Running
from runner.worker.setup import RankSetup
from test_running import running_of

pytestmark = pytest.mark.unit

PEER = JobFailure(rank=0, host="a", text="RuntimeError: boom", time=10.0)


def state_of(running: Running) -> AttemptState:
    return AttemptState(ranks=tuple(s.place.global_rank for s in running.setups), scripts=False,
                        stop_signal=signal.SIGUSR1, grace_s=10.0)


def monitor_of(running: Running, **kwargs: object) -> tuple[Monitor, AgentInbox, Clock]:
    clock, inbox = Clock(1000.0), AgentInbox()
    return Monitor(running, inbox, clock=clock, wall=lambda: 1700.0, **kwargs), inbox, clock


def folder_channel(paths: RunPaths) -> JobChannel:
    return JobChannel.in_folder(paths.channel_folder(None))


def test_a_rank_whose_process_ended_is_an_exit_its_output_taken_and_read_once(paths) -> None:
    running = running_of(paths, lives={1: RankLife(started=0.0, returned=1690.0)})
    monitor, _, _ = monitor_of(running)
    state = state_of(running)
    running.ranks[1].ends_with = 1
    assert monitor.exits(state) == [RankExited(rank=3, code=1, at=1700.0, returned_at=1690.0)]
    assert running.relay.drained == [1]
    state.handle(RankExited(rank=3, code=1, at=1700.0), 0.0)
    assert monitor.exits(state) == []


def test_what_reached_the_agent_from_outside_is_taken_from_its_inbox_once(paths) -> None:
    monitor, inbox, _ = monitor_of(running_of(paths))
    state = state_of(monitor.running)
    inbox.signalled(signal.SIGTERM)
    inbox.end(PEER)
    inbox.ask_where()
    assert monitor.signals(state) == [Signalled(signum=signal.SIGTERM)]
    assert monitor.ends(state) == [EndedFromOutside(failure=PEER)]
    assert monitor.where_asked(state) == [WhereAsked()]
    assert (monitor.signals(state), monitor.ends(state), monitor.where_asked(state)) == ([], [], [])


def test_the_channel_is_read_every_peer_poll_s_for_a_new_stop_request_and_another_hosts_failure(paths) -> None:
    channel = folder_channel(paths)
    channel.open_attempt(0)
    monitor, _, clock = monitor_of(running_of(paths, channel=channel))
    state = state_of(monitor.running)
    channel.request_stop(signal.SIGUSR1, "a")
    channel.say_failed(0, PEER)
    assert monitor.channel_news(state) == []  # not yet
    clock.sleep(PEER_POLL_S)
    asked = channel.stop_requested()
    assert monitor.channel_news(state) == [Signalled(signum=signal.SIGUSR1, origin="a", asked=asked),
                                           PeerFailed(failure=PEER)]
    state.handle(Signalled(signum=signal.SIGUSR1, origin="a", asked=asked), 0.0)
    clock.sleep(PEER_POLL_S)
    assert monitor.channel_news(state) == [PeerFailed(failure=PEER)]  # the request seen already
    state.handle(Signalled(signum=signal.SIGINT), 0.0)  # stopping: another failure is not looked for
    clock.sleep(PEER_POLL_S)
    assert monitor.channel_news(state) == []


def failed(setup: RankSetup, timeout: bool) -> None:
    place = setup.place
    setup.outcome.record_error(ErrorRecord(rank=place.global_rank, local_rank=place.local_rank, host=place.host,
                                           machine="machine1", pid=4000, timestamp=100.0,
                                           exception="RuntimeError: Wait timeout" if timeout else "RuntimeError: boom",
                                           timeout=timeout))


def test_a_collective_timeout_names_the_ranks_still_running_until_they_were_asked_for_their_stacks(paths) -> None:
    running = running_of(paths, 0, spec=make_spec(nodes=1, devices_per_node=3))
    failed(running.setups[0], timeout=True)
    running.setups[2].outcome.mark_done(False)  # returned, not exited yet
    monitor, _, _ = monitor_of(running)
    state = state_of(running)
    assert monitor.timed_out(state) == [TimedOut(running=(1,))]
    state.handle(TimedOut(running=(1,)), 0.0)
    assert monitor.timed_out(state) == []


def test_a_failure_that_is_no_timeout_is_no_timeout(paths) -> None:
    running = running_of(paths)
    failed(running.setups[0], timeout=False)
    monitor, _, _ = monitor_of(running)
    assert monitor.timed_out(state_of(running)) == []


def test_the_run_folders_request_for_dumps_is_read_every_peer_poll_s(paths) -> None:
    monitor, _, clock = monitor_of(running_of(paths))
    state = state_of(monitor.running)
    assert monitor.dump_requests(state) == []  # none made
    asked = request_dumps(paths, "timeout")
    assert monitor.dump_requests(state) == []  # looked a moment ago
    clock.sleep(PEER_POLL_S)
    assert monitor.dump_requests(state) == [DumpsRequested(at=asked, reason="request")]


def test_a_rank_stuck_at_its_end_is_found_by_the_end_guard_with_where_its_stacks_go(paths) -> None:
    life = RankLife(started=0.0, destroyed=2.0)
    wall = Clock(100.0)
    guard = EndGuard(clock=wall, cpu=lambda _pid: 1.5, waits_for=lambda _pid: Waiting("its main thread sleeps"))
    running = running_of(paths, lives={0: life})
    monitor, _, _ = monitor_of(running, guard=guard)
    state = state_of(running)
    assert monitor.stuck_at_end(state) == []  # quiet from now on
    wall.sleep(QUIET_S)
    found = monitor.stuck_at_end(state)
    assert [(e.rank, e.stacks) for e in found] == [(2, str(running.setups[0].log_file))]
    assert isinstance(found[0], StuckAtEnd) and found[0].stuck.work_done


def test_no_progress_for_stall_timeout_s_and_a_margin_is_a_stall_seen(paths) -> None:
    spec = make_spec(nodes=1, devices_per_node=2)
    spec = dataclasses.replace(spec, launcher=dataclasses.replace(spec.launcher, stall_timeout_s=30.0))
    lives = {0: RankLife(started=0.0, joined=1600.0, progressed=1700.0 - 30.0 - STALL_MARGIN_S)}
    running = running_of(paths, 0, spec=spec, lives=lives)
    monitor, _, _ = monitor_of(running)
    assert monitor.stall(state_of(running)) == [StallSeen(quiet_s=30.0 + STALL_MARGIN_S)]
    lives[0].progressed = 1690.0
    running.relay.lives.update(lives)
    assert monitor.stall(state_of(running)) == []
    assert monitor_of(running_of(paths, 0, lives=lives))[0].stall(state_of(running)) == []  # no stall_timeout_s


def test_rank_0s_step_is_seen_where_rank_0_is_here_and_someone_asked(paths) -> None:
    life = RankLife(started=0.0, step=41, resumed=40, copy_host="b", copy_save=7)
    here = running_of(paths, 0, lives={0: life})
    assert monitor_of(here, reports_steps=True)[0].step(state_of(here)) == [
        StepSeen(step=41, resumed=40, copy_host="b", copy_save=7)]
    assert monitor_of(here)[0].step(state_of(here)) == []
    elsewhere = running_of(paths, 1, lives={0: life})  # host b: ranks 2 and 3
    assert monitor_of(elsewhere, reports_steps=True)[0].step(state_of(elsewhere)) == []


def test_every_look_ends_with_a_tick_and_no_source_acts(paths) -> None:
    channel = folder_channel(paths)
    channel.open_attempt(0)
    running = running_of(paths, 0, channel=channel, lives={0: RankLife(started=0.0, destroyed=2.0)})
    failed(running.setups[1], timeout=True)
    monitor, inbox, clock = monitor_of(running, reports_steps=True)
    inbox.signalled(signal.SIGINT)
    channel.request_stop(signal.SIGTERM, "b")
    clock.sleep(PEER_POLL_S)
    before = sorted(p.name for p in paths.channel_folder(None).iterdir())
    state = state_of(running)
    events = [e for source in monitor.sources() for e in source(state)]
    assert events[-1] == Tick() and Signalled(signum=signal.SIGINT) in events
    assert [r.signalled for r in running.ranks] == [[], []]
    assert sorted(p.name for p in paths.channel_folder(None).iterdir()) == before
    assert not any(paths.logs.glob("*dump*"))
