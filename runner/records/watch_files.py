"""The files by which a run's ranks are asked where they are and answer, in the run folder (runner.records.paths):
a request (``logs/diagnose.request``: its time and reason) that every rank's watch (runner.worker.watch) looks for,
so that ranks on other hosts see it through a shared run folder; each rank's answer, its dump
(``logs/rank<r>.collectives.json``, runner.records.dumps.RankDump), which it also writes at its end; its heartbeat
(``logs/rank<r>.beat``: when it last completed a collective or a progress step); and the verdict on a hang once one
was said (``logs/diagnosis.json``). The job's channel (runner.worker.channel) carries the same across hosts without a
shared folder.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.common.files import write_atomically
from runner.common.polling import poll
from runner.records.dumps import RankDump
from runner.records.paths import RankPaths, RunPaths


@dataclass(frozen=True)
class RankWatchFiles:
    """What one rank's watch writes in the run folder: its dump and its heartbeat."""

    paths: RunPaths
    rank: int

    @property
    def files(self) -> RankPaths:
        return self.paths.rank(self.rank)

    def write_dump(self, dump: RankDump) -> None:
        write_atomically(self.files.dump, json.dumps(dump.document()))

    def dump(self) -> RankDump | None:
        """Its last dump; None where it wrote none (or one that is not a dump)."""
        try:
            return RankDump.from_document(json.loads(self.files.dump.read_text()))
        except (OSError, ValueError):
            return None

    def write_beat(self, progressed_s: float) -> None:
        write_atomically(self.files.beat, f"{progressed_s:.3f}\n")

    def last_progress(self) -> float | None:
        """When the rank last completed a collective or a progress step (time.time()); None: no beat yet."""
        try:
            return float(self.files.beat.read_text())
        except (OSError, ValueError):
            return None


def end_dumps(paths: RunPaths, ranks: Iterable[int]) -> dict[int, RankDump]:
    """The dumps the ranks wrote at their end (the straggler is found from them), by rank."""
    return {r: d for r in ranks if (d := RankWatchFiles(paths, r).dump()) is not None and d.reason == "end"}


# -- asking every rank ------------------------------------------------------------------------------------------


def request_dumps(paths: RunPaths, reason: str) -> float:
    """Ask every rank of the run for its dump (they watch this file); the time of the request."""
    now = time.time()
    write_atomically(paths.dump_request, json.dumps({"time": now, "reason": reason}))
    return now


def _document(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def last_request(paths: RunPaths) -> float | None:
    """When the ranks were last asked for their dumps, or None."""
    try:
        return float((_document(paths.dump_request) or {})["time"])
    except (KeyError, TypeError, ValueError):
        return None


def requested_since(paths: RunPaths, since: float) -> str | None:
    """The reason of a request made after ``since``, or None."""
    doc = _document(paths.dump_request) or {}
    return doc.get("reason", "request") if doc.get("time", 0) > since else None


def collect_dumps(paths: RunPaths, ranks: Iterable[int], since: float, wait_s: float = 0.0,
                  elsewhere: Callable[[int], RankDump | None] | None = None) -> dict[int, RankDump]:
    """The ranks' dumps written at or after ``since``, from ``elsewhere`` (the job's channel: any host) where it has
    one, else from the run folder, waiting up to ``wait_s`` for the missing ones."""
    ranks = list(ranks)

    def fresh(dump: RankDump | None) -> bool:
        return dump is not None and dump.time >= since - 0.001

    def look() -> dict[int, RankDump]:
        found = {}
        for r in ranks:
            dump = elsewhere(r) if elsewhere is not None else None
            if not fresh(dump):
                dump = RankWatchFiles(paths, r).dump()
            if fresh(dump):
                found[r] = dump
        return found

    return poll(look, lambda found: len(found) == len(ranks), wait_s)


# -- the verdict ------------------------------------------------------------------------------------------------


def write_diagnosis(paths: RunPaths, kind: str, text: str, facts: Mapping[str, Any] | None) -> None:
    """What a hang of attempt ``paths.attempt`` was, in words and facts (read by the failure report, the run's
    summary and the hang rule before the next attempt: runner.worker.hung_hosts)."""
    write_atomically(paths.diagnosis, json.dumps({**(facts or {}), "kind": kind, "text": text,
                                                  "attempt": paths.attempt}))


def read_diagnosis(paths: RunPaths) -> dict[str, Any] | None:
    return _document(paths.diagnosis)


def clear_diagnosis(paths: RunPaths) -> None:
    """Forget an earlier attempt's request and diagnosis (a restarted job; the dumps are told apart by time)."""
    for path in (paths.dump_request, paths.diagnosis):
        path.unlink(missing_ok=True)

