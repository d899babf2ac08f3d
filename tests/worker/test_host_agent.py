"""runner.worker.host_agent: the loop over attempts, the parts that need no process: how a host's ranks ended
(HostEnding), an agent made from its host's share, which agent serves the store, and what reaches it from outside
(its inbox). Whole runs: tests/launchers/test_local_launcher.py, tests/e2e."""

from __future__ import annotations

import signal

import pytest

from runner.plan.processes import Plan
from runner.records.paths import RunPaths
from runner.worker.channel_records import JobFailure
from runner.worker.host_agent import HostAgent
from runner.worker.host_ending import HostEnding
from runner.worker.share import HostShare
from test_preparation import EIGHT_CPUS, plan_of, two_hosts

pytestmark = pytest.mark.unit


def agent_of(plan: Plan, node_rank: int, paths: RunPaths, *, only: int | None = None) -> HostAgent:
    """The agent of host ``node_rank``'s share of ``plan`` (or of its one rank ``only``), not run."""
    return HostAgent(HostShare(plan=plan, node_rank=node_rank, paths=paths, environment=EIGHT_CPUS), only=only)


# -------------------------------------------------------------------------- how a host's ranks ended


def test_a_host_failed_when_any_rank_ended_badly_and_by_itself_only_when_the_agent_had_not_stopped_it() -> None:
    assert not HostEnding(codes={0: 0, 1: 0}, order=[0, 1]).failed
    stopped = HostEnding(codes={0: 0, 1: -signal.SIGTERM}, order=[0, 1], stopped={1})
    assert stopped.failed and not stopped.failed_by_itself() and stopped.first_failure() is None
    raised = HostEnding(codes={0: 1, 1: -signal.SIGTERM}, order=[0, 1], stopped={1})
    assert raised.failed and raised.failed_by_itself()


def test_the_first_failure_is_the_first_rank_to_exit_badly_by_itself_not_the_lowest_index() -> None:
    ending = HostEnding(codes={0: 1, 1: -signal.SIGTERM, 2: -signal.SIGKILL, 3: 0}, order=[3, 1, 2, 0], stopped={1})
    assert ending.first_failure() == 2


# -------------------------------------------------------------------------- the agent


def test_an_agent_is_made_from_its_hosts_share_whole(paths) -> None:
    share = HostShare(plan=plan_of(two_hosts(), paths), node_rank=1, paths=paths, environment=EIGHT_CPUS, restarts=3)
    agent = HostAgent(share, announce=True)
    assert (agent.plan, agent.node_rank, agent.paths, agent.environment, agent.restarts, agent.announce) == \
        (share.plan, 1, paths, EIGHT_CPUS, 3, True)


@pytest.mark.parametrize("node_rank, only, serves", [(0, None, True), (0, 0, True), (0, 1, False), (1, None, False),
                                                     (1, 2, False)])
def test_the_agent_of_host_0_serves_the_store_or_with_a_task_per_process_global_rank_0s(paths, node_rank, only,
                                                                                         serves) -> None:
    agent = agent_of(plan_of(two_hosts(), paths), node_rank, paths, only=only)
    assert agent.serves is serves
