"""runner.worker.agent_reports: what a host agent reports as it runs (``HostAgent.reporter``): rank 0's step, at
once at an attempt's first step and then at most every STEP_REPORT_S; nothing where rank 0 is not its host's, or
nobody asked. (An attempt's beginning, and the reports crossing ssh: tests/e2e/test_lost_hosts.py.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from clocks import Clock
from runner.worker import host_agent
from runner.worker.agent_reports import StepReached
from runner.worker.rank_life import RankLife
from test_host_agent import EIGHT_CPUS, plan_of, setups_of, two_hosts
from runner.worker.host_agent import HostAgent, STEP_REPORT_S, _Running
from runner.worker.share import HostShare

pytestmark = pytest.mark.unit


def host(paths, node_rank: int, monkeypatch, reporter=None) -> tuple[HostAgent, _Running, RankLife, Clock]:
    """Host ``node_rank``'s agent of a 2 x 2 job and its running attempt 3, rank 0's life (if here) to move."""
    clock = Clock(500.0)
    monkeypatch.setattr(host_agent, "time", SimpleNamespace(monotonic=clock, time=lambda: 1700.0))
    spec = two_hosts()
    share = HostShare(plan=plan_of(spec, paths), node_rank=node_rank, paths=paths, environment=EIGHT_CPUS)
    agent = HostAgent(share, reporter=reporter)
    setups = setups_of(spec, paths, node_rank)
    life = RankLife(started=0.0)
    relay = SimpleNamespace(life=lambda index: life if index == 0 else None)
    running = _Running(ranks=[SimpleNamespace(index=i) for i in range(len(setups))], setups=setups, relay=relay,
                       channel=None, attempt=3, state=None)
    return agent, running, life, clock


def test_rank_0s_first_step_is_reported_at_once_then_at_most_every_step_report_s(paths, monkeypatch) -> None:
    said: list = []
    agent, running, life, clock = host(paths, 0, monkeypatch, said.append)
    agent._report_rank_0s_step(running)
    assert said == []  # no progress bar yet
    life.step, life.resumed = 40, 40  # resumed at 40: no step of this attempt yet
    life.copy_host, life.copy_save = "b", 7  # from host b's copy, the run's 7th save
    agent._report_rank_0s_step(running)
    life.step = 41
    agent._report_rank_0s_step(running)  # the first step: at once
    clock.sleep(STEP_REPORT_S / 2)
    life.step = 42
    agent._report_rank_0s_step(running)  # too soon
    clock.sleep(STEP_REPORT_S / 2)
    agent._report_rank_0s_step(running)
    agent._report_rank_0s_step(running)  # the same step: nothing new
    assert [(r.step, r.resumed) for r in said] == [(40, 40), (41, 40), (42, 40)]
    assert all(r == StepReached(attempt=3, step=r.step, resumed=40, at=1700.0, copy_host="b", copy_save=7)
               for r in said)


def test_a_host_without_rank_0_or_an_agent_nobody_asked_reports_nothing(paths, monkeypatch) -> None:
    said: list = []
    agent, running, life, _ = host(paths, 1, monkeypatch, said.append)  # host b: ranks 2 and 3
    life.step, life.resumed = 5, 0
    agent._report_rank_0s_step(running)
    assert said == []
    agent, running, life, _ = host(paths, 0, monkeypatch)
    life.step, life.resumed = 5, 0
    agent._report_rank_0s_step(running)  # no reporter: nothing to do, nothing raised
