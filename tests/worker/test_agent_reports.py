"""runner.worker.agent_reports: what a host agent reports as it runs (``HostAgent.reporter``): rank 0's step, at
once at an attempt's first step and then at most every STEP_REPORT_S; nothing where rank 0 is not its host's, or
nobody asked. The step is read by the monitor, timed by the attempt's state machine and reported by the executor.
(An attempt's beginning, and the reports crossing ssh: tests/e2e/test_lost_hosts.py.)"""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Callable

import pytest

from clocks import Clock
from runner.worker.agent_reports import AgentReport, StepReached
from runner.worker.attempt_state import STEP_REPORT_S, AttemptState
from runner.worker.executor import Executor
from runner.worker.inbox import AgentInbox
from runner.worker.monitor import Monitor
from runner.worker.rank_life import RankLife
from test_running import Rank, running_of

pytestmark = pytest.mark.unit


def host(paths, node_rank: int, reporter: Callable[[AgentReport], None] | None = None
         ) -> tuple[Callable[[], None], RankLife, Clock, tuple[Rank, ...]]:
    """Host ``node_rank``'s agent of a 2 x 2 job in its attempt 3, rank 0's life (if here) to move: a look at its
    ranks' exits and at rank 0's step, as the agent's loop takes them (set ``ends_with`` on rank 0's: it exits)."""
    clock = Clock(500.0)
    life = RankLife(started=0.0)
    running = running_of(dataclasses.replace(paths, attempt=3), node_rank, lives={0: life})
    state = AttemptState(ranks=tuple(s.place.global_rank for s in running.setups), scripts=False,
                         stop_signal=signal.SIGUSR1, grace_s=1.0)
    monitor = Monitor(running, AgentInbox(), reports_steps=reporter is not None, clock=clock)
    executor = Executor(running, state, None, reporter, clock=lambda: 1700.0)  # type: ignore[arg-type]

    def look() -> None:
        for event in (*monitor.exits(state), *monitor.step(state)):
            for directive in state.handle(event, clock()):
                executor.carry_out(directive)

    return look, life, clock, running.ranks  # type: ignore[return-value]


def test_rank_0s_first_step_is_reported_at_once_then_at_most_every_step_report_s(paths) -> None:
    said: list = []
    look, life, clock, _ = host(paths, 0, said.append)
    look()
    assert said == []  # no progress bar yet
    life.step, life.resumed = 40, 40  # resumed at 40: no step of this attempt yet
    life.copy_host, life.copy_save = "b", 7  # from host b's copy, the run's 7th save
    look()
    life.step = 41
    look()  # the first step: at once
    clock.sleep(STEP_REPORT_S / 2)
    life.step = 42
    look()  # too soon
    clock.sleep(STEP_REPORT_S / 2)
    look()
    look()  # the same step: nothing new
    assert [(r.step, r.resumed) for r in said] == [(40, 40), (41, 40), (42, 40)]
    assert all(r == StepReached(attempt=3, step=r.step, resumed=40, at=1700.0, copy_host="b", copy_save=7)
               for r in said)


def test_rank_0s_last_step_is_reported_as_it_exits_however_soon(paths) -> None:
    """A join's record (membership.jsonl: the steps lost) needs the step rank 0 stopped at, which may come within
    STEP_REPORT_S of the last said: the drain of its pipes read it, and it is said once."""
    said: list = []
    look, life, clock, ranks = host(paths, 0, said.append)
    life.step, life.resumed = 41, 40
    look()  # the first step: at once
    clock.sleep(STEP_REPORT_S / 4)
    life.step = 43  # two more, then its exit: its pipes drained, its life no longer the relay's
    ranks[0].ends_with = 0
    look()
    look()  # said once
    assert [r.step for r in said] == [41, 43]


def test_a_host_without_rank_0_or_an_agent_nobody_asked_reports_nothing(paths) -> None:
    said: list = []
    look, life, _, _ = host(paths, 1, said.append)  # host b: ranks 2 and 3
    life.step, life.resumed = 5, 0
    look()
    assert said == []
    look, life, _, _ = host(paths, 0)
    life.step, life.resumed = 5, 0
    look()  # no reporter: nothing to do, nothing raised
