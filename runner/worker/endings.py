"""How every rank of a job ended, in host 0's run folder, whatever host it ran on.

Each host agent writes its ranks' outcome files into its own run folder (runner.records.outcomes). Hosts started by
hand each have their own folder, so every agent also puts its ranks' records on the job's channel
(runner.worker.channel: ``ended/<attempt>/<rank>``) as its share ends, and host 0's agent, before it closes the
store, waits for the others' and writes them into its folder as if its own ranks had: the run's summary, the
sweep's table and the straggler then count every rank of every host.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from runner.common.polling import Sleep, poll
from runner.plan.processes import Plan
from runner.records.dumps import RankDump
from runner.records.outcomes import ErrorRecord, RankOutcome
from runner.records.paths import RunPaths
from runner.records.watch_files import RankWatchFiles
from runner.worker.channel import POLL_S, JobChannel
from runner.worker.channel_records import JobFailure, RankEnding, RankReturned
from runner.worker.failures import agent_seen_error, silent_end
from runner.worker.host_ending import HostEnding
from runner.worker.setup import RankSetup



def _record(setup: RankSetup, code: int | None, stopped: bool, ended_at: float | None) -> RankEnding:
    outcome = setup.outcome
    dump = RankWatchFiles(setup.paths, setup.place.global_rank).dump()
    error = outcome.error()
    if error is None and code and not stopped and not outcome.done:  # it could say nothing: as its agent saw it
        error = agent_seen_error(setup.place, silent_end(code), ended_at)
    returned = RankReturned(stopped=outcome.returned_on_request, result=outcome.result,
                            ended=outcome.ended_by_its_agent) if outcome.done else None
    return RankEnding(host=setup.place.host, code=code, stopped=stopped, error=error, returned=returned,
                      joined=outcome.backend if outcome.joined else None,
                      end_dump=dump.document() if dump is not None and dump.reason == "end" else None)


def share_ended(channel: JobChannel, paths: RunPaths, setups: list[RankSetup], ending: HostEnding) -> None:
    """This agent's ranks have ended: their records on the channel."""
    for setup in setups:
        rank = setup.place.global_rank
        channel.say_ended(paths.attempt, rank,
                          _record(setup, ending.codes.get(rank), rank in ending.stopped, ending.ended_at.get(rank)))


def gather_endings(channel: JobChannel, paths: RunPaths, plan: Plan, local: Iterable[int], wait_s: float,
                   gone: Mapping[str, str] | None = None, *, sleep: Sleep = time.sleep) -> list[int]:
    """Host 0: the other hosts' ranks' records, waited for up to ``wait_s``, written into this run folder; a rank
    whose host said nothing by then is recorded as gone. ``gone``: hosts known to be gone (host -> why: launcher=ssh
    or manual's watch lost them), whose ranks are not waited for: read as it is waited, since a host may be found
    gone meanwhile (the same mapping, filled in by another thread). The ranks it had no record of. ``sleep``: between
    two looks (a test's may return at once)."""
    local, gone = set(local), gone if gone is not None else {}
    missing = [r.global_rank for r in plan.records if r.global_rank not in local]

    def look() -> list[int]:
        nonlocal missing
        found = {r: ending for r in missing if (ending := channel.ended(paths.attempt, r)) is not None}
        for rank, ending in found.items():
            _write(paths, rank, ending)
        missing = [r for r in missing if r not in found]
        return missing

    # the ranks of hosts known to be gone are not waited for
    missing = poll(look, lambda left: all(plan.records[r].host in gone for r in left), wait_s, POLL_S, sleep=sleep)
    for rank in missing:
        rec = plan.records[rank]
        why = f"its host {rec.host} is gone: {gone[rec.host]}" if rec.host in gone else \
            f"no word from its host {rec.host} within {wait_s:g} s of the end (its agent gone?)"
        outcome = RankOutcome(paths, rank)
        outcome.clear()  # an earlier attempt's files of that rank would tell another story
        outcome.record_error(agent_seen_error(rec, why))
    return missing


def _write(paths: RunPaths, rank: int, ending: RankEnding) -> None:
    outcome = RankOutcome(paths, rank)
    outcome.clear()
    if ending.joined is not None:
        outcome.mark_joined(ending.joined)
    if ending.returned is not None:
        outcome.mark_done(ending.returned.stopped, ending.returned.result, ending.returned.ended)
    if ending.error is not None:  # its own, or how its agent saw it end (_record)
        outcome.record_error(ending.error)
    if ending.end_dump is not None and (dump := RankDump.from_document(ending.end_dump)) is not None:
        RankWatchFiles(paths, rank).write_dump(dump)


def peer_failure(paths: RunPaths, plan: Plan, failure: JobFailure) -> None:
    """Another host's rank failed first, and this host stopped its own: that rank's failure, as the channel said it,
    in this run folder too, so that this host's summary tells the same story as the failing host's."""
    rank = failure.rank
    if rank is None or not 0 <= rank < plan.world_size or RankOutcome(paths, rank).error() is not None:
        return  # (a run folder the hosts share has that rank's own record)
    rec = plan.records[rank]
    RankOutcome(paths, rank).record_error(ErrorRecord(rank=rank, local_rank=rec.local_rank, host=failure.host or rec.host,
                                                      machine=None, pid=None, timestamp=failure.time or time.time(),
                                                      exception=failure.text))
