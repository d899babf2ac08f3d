"""The message that hands one host's share of a job to the process that runs it: what every host agent is made from
(runner.worker.host_agent.HostAgent), and the two rules every process that holds a share follows: how often the share
starts again by itself, and how long it may take to stop.

`run` (launcher=local, and each host of launcher=manual) sends it to its launch agent (runner.app.agent), which
runs it with a host agent (runner.worker.host_agent.launch_host); without a launch agent `run` runs it itself. A
scheduler's task and an ssh host's `run` (runner.app.host_entry) make their own, from the plan they make again where
they run. It crosses a pipe (pickled), so it holds plain records only.
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.environments.process import ProcessEnvironment
from runner.records.paths import RunPaths
from runner.plan.processes import Plan
from runner.spec.schema import JobConfig, LauncherConfig
from runner.worker.attempt_state import FAILURE_STOP_S, HARD_STOP_MARGIN_S


@dataclass(frozen=True, kw_only=True)
class HostShare:
    """Host ``node_rank``'s processes of ``plan``, to start and watch to their end."""

    plan: Plan
    node_rank: int
    paths: RunPaths  # the run folder, at the attempt to start with
    environment: ProcessEnvironment  # what `run` read of its own environment (runner.environments.process)
    restarts: int = 0  # start the share again after a failure, up to this many times (launcher.max_restarts)


@dataclass(frozen=True, kw_only=True)
class AgentRole:
    """Which agent of its job a host agent is: host ``node_rank``'s, or (a scheduler's task per process) the agent of
    global rank ``only`` alone."""

    node_rank: int
    only: int | None = None

    @property
    def serves(self) -> bool:
        """This agent serves the job's store and channel: host 0's (a task per process: global rank 0's)."""
        return self.node_rank == 0 and self.only in (None, 0)

    def agents(self, plan: Plan) -> list[int]:
        """Every agent of the job, each named by the global rank of its first rank: a host's (one per host), or each
        rank's (a task per process)."""
        if self.only is not None:
            return [rec.global_rank for rec in plan.records]
        return [plan.host_records(h.index)[0].global_rank for h in plan.job.hosts]


def restarts_in_place(spec: JobConfig) -> int:
    """How many times a share that restarts itself (its host agent, after a rank's failure) starts again:
    launcher.max_restarts; a preflight checks once, and never starts again."""
    return 0 if spec.preflight else spec.launcher.max_restarts


def hard_stop_s(launcher: LauncherConfig) -> float:
    """The most a share takes to end once it is stopped as on SIGTERM: the ranks' grace (launcher.grace_s), the
    agent's stop after it (FAILURE_STOP_S) and a margin. A process whose holder is gone ends whatever of its share
    still runs this long after it stopped it; the hosts of launcher=manual wait this long (and more) for a host that
    has not ended its share."""
    return max(0.0, launcher.grace_s) + FAILURE_STOP_S + HARD_STOP_MARGIN_S
