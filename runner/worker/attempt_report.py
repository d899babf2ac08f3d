"""A host agent's last phase of each attempt, as torch elastic's agent names it: **report**. How this host's share
ended, said and recorded (runner.worker.failures); every agent puts its ranks' records on the job's channel, and host
0's writes them all into its run folder (runner.worker.endings). Under mpirun, which kills every task once one has
ended badly, the tasks end each attempt together, once host 0's has reported it (:func:`end_together`)."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from runner.common import exits
from runner.common.polling import poll
from runner.plan.processes import Plan
from runner.records.paths import RunPaths
from runner.worker.channel import JobChannel
from runner.worker.endings import gather_endings, peer_failure, share_ended
from runner.worker.failures import agent_seen_error, report_host_ending
from runner.worker.host_ending import HostEnding
from runner.worker.inbox import TICK_S
from runner.worker.preflight.checks import HostChecks
from runner.worker.preflight.outcome import outcome as preflight_outcome
from runner.worker.setup import RankSetup, by_rank
from runner.worker.share import AgentRole

ENDINGS_WAIT_S = 15.0  # how long host 0 waits for the other hosts to say how their ranks ended
REPORTED_WAIT_S = ENDINGS_WAIT_S + 15.0  # how long another task waits for host 0's report, where tasks end together
LEFT_WAIT_S = 2.0  # ... and how long host 0's keeps its store for them to say they heard it


@dataclass(frozen=True, kw_only=True)
class Ended:
    """One attempt at its end: how its ranks ended, what they ran with, this host's preflight report (preflight=true),
    the job's channel, and how long it took."""

    ending: HostEnding
    plan: Plan
    paths: RunPaths
    setups: Sequence[RankSetup]
    report: HostChecks | None
    channel: JobChannel | None
    elapsed_s: float


def report(ended: Ended, role: AgentRole, *, announce: bool = False, gone: Mapping[str, str] | None = None) -> int:
    """Say how this host's share ended; its exit status. Every agent puts its ranks' records on the job's
    channel; host 0's then writes the other hosts' into its run folder (the run's summary covers every rank).
    ``announce``: end with a line saying how the host's share ended; ``gone``: hosts gone (their ranks say nothing)."""
    ending, plan, paths, channel = ended.ending, ended.plan, ended.paths, ended.channel
    setups = list(ended.setups)
    _record_the_stuck(ending, setups)
    if channel is not None:
        share_ended(channel, paths, setups, ending)
        if role.serves and len(setups) < plan.world_size:
            gather_endings(channel, paths, plan, {s.place.global_rank for s in setups},
                           min(ENDINGS_WAIT_S, plan.job.spec.init.timeout_s), gone=dict(gone or {}))
    if ending.peer_failed:
        failure = ending.peer_failed
        peer_failure(paths, plan, failure)
        if failure.rank is not None:
            who, more = f"rank {failure.rank} on {failure.host} failed: ", "; that host's report says more"
        elif failure.stall:  # this agent's stall watchdog: the text says it all
            who, more = "", ""
        else:  # a host itself: lost, or its `run` ended (launcher=ssh says so)
            who, more = f"host {failure.host}: ", ""
        print(f"\n{who}{failure.text}\n    stopped this host's {len(setups)} process(es) "
              f"(attempt {paths.attempt + 1}){more}", file=sys.stderr, flush=True)
        return exits.FAILED
    if ending.signum is not None:
        return exits.from_signal(ending.signum)
    if ending.earlier:
        peer_failure(paths, plan, ending.earlier)
    if ended.report is not None:
        code = preflight_outcome(ending, setups, paths)
    else:
        code = report_host_ending(ending, setups, paths, ended.elapsed_s, announce, channel)
    if ending.earlier:
        failure = ending.earlier
        what = f"rank {failure.rank} on {failure.host} failed" if failure.rank is not None else f"host {failure.host}"
        print(f"\nthe job's first failure, on another host: {what}: {failure.text}\n    this host's rank(s) failed "
              f"after it", file=sys.stderr, flush=True)
    return code


def _record_the_stuck(ending: HostEnding, setups: list[RankSetup]) -> None:
    """The ranks the end guard ended, recorded as what they were: done with their work, or failed."""
    placed = by_rank(setups)
    for rank, stuck in ending.stuck.items():
        outcome = placed[rank].outcome
        if stuck.work_done:
            outcome.mark_ended_after_its_work(stuck.text)
        elif not outcome.failed:
            outcome.record_error(agent_seen_error(placed[rank].place, stuck.text, ending.ended_at.get(rank)))


def end_together(ended: Ended, role: AgentRole) -> None:
    """Under a scheduler that kills every task once one has ended badly (mpirun: the others get SIGTERM, then
    SIGKILL, a second apart), no task ends its attempt before host 0 has reported it, so that no report is cut
    short: host 0's agent says it has, the others wait for that word (or for host 0's store to go away) and say
    they heard it, and host 0's keeps its store until they have (for a moment at most)."""
    channel, attempt = ended.channel, ended.paths.attempt
    if channel is None or not ended.plan.rules.tasks_end_together:
        return
    if role.serves:
        channel.say_reported(attempt)
        others = [rank for rank in role.agents(ended.plan) if rank != 0]
        poll(lambda: channel.left(attempt, others), lambda heard: len(heard) == len(others), LEFT_WAIT_S, TICK_S)
    elif ended.setups:
        poll(lambda: channel.reported(attempt), bool, REPORTED_WAIT_S, TICK_S)
        channel.say_left(attempt, ended.setups[0].place.global_rank)
