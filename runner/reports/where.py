"""Where the ranks are, asked by `run` itself: Ctrl-\\ (SIGQUIT) to `run`, and a followed Slurm job cancelled by
Ctrl-C or SIGTERM (Slurm signals every process of the job at once, so the ranks are asked before). Every rank
writes its collectives and where its main thread is (runner.records.watch_files) into the run folder, which `run`
reads: on the launching machine, that is the one place every host writes to. Where the hosts share no folder
(launcher=ssh), host 0's agent answers instead, through the job's channel (runner.worker.host_agent)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable

from runner.plan.processes import Plan
from runner.records.dumps import DUMP_WAIT_ASKED_S, RankDump
from runner.records.paths import RunPaths
from runner.records.watch_files import collect_dumps, request_dumps
from runner.reports.hangs import diagnose, stuck_ranks



def where_the_ranks_are(plan: Plan, paths: RunPaths, then: str = "the job goes on",
                        ask: Callable[[RunPaths, str], float] = request_dumps,
                        gather: Callable[[RunPaths, Iterable[int], float, float], dict[int, RankDump]] = collect_dumps
                        ) -> None:
    """Ask every rank where it is, and say it in one paragraph (each rank also writes its full stack to its log).
    ``ask`` and ``gather``: through the run folder, or (an agent's) the job's channel as well."""
    asked = ask(paths, "request")
    dumps = gather(paths, range(plan.world_size), asked, DUMP_WAIT_ASKED_S)
    found = diagnose(dumps, plan.world_size)
    stuck = stuck_ranks(dumps)
    answered = sum(1 for d in dumps.values() if not d.stuck)
    said = found.text if found else (f"{answered} of {plan.world_size} rank(s) answered, none in a collective yet"
                                     + (f"; {stuck}" if stuck else ""))
    logs, _ = paths.rank_files(lambda r: r.log)
    print(f"\nwhere the ranks are: {said}\n    (stacks: {logs}; {then})", file=sys.stderr, flush=True)
