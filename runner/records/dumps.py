"""What a rank records of its collectives: per process group the last collective it entered and the last that
completed, its last entries (sequence number, operation, shapes, dtypes, when it entered), and where its main thread
is. A rank's watch (runner.worker.watch) makes one from torch's flight recorder, or from the runner's own counter of
the recipe's torch.distributed calls where torch has none; its host agent makes one for a rank whose watch cannot run
(the GIL held by native code: ``stuck`` says what its threads do); it travels as JSON, in the run folder
(runner.records.watch_files) and on the job's channel (runner.worker.channel). What it says of a hang or a slow rank
is runner.reports.hangs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

# How long a gathering of the ranks' dumps waits at most; each returns as soon as every rank asked has answered.
DUMP_WAIT_STALL_S = 10.0  # rank 0 at a stall, for the others' (on a busy machine, another host's ranks answer
# through the job's channel in seconds)
DUMP_WAIT_TIMEOUT_S = 5.0  # the report, after a collective timed out
LOST_PEER_SLACK_S = 1.0  # a rank that lost its peer to another's timeout dumps as it fails: up to this long before
# the timed-out rank asks (its peer's connection closed as the timeout fired, before the ask was written)
DUMP_WAIT_ASKED_S = 3.0  # `run`, asked where the ranks are (Ctrl-\, SIGQUIT)
DUMP_WAIT_STOP_S = 2.0  # a host agent stopping its ranks, for where they were


@dataclass(frozen=True)
class Collective:
    """One collective a rank entered."""

    seq: int  # its number in its process group, from 1
    op: str  # all_reduce, broadcast, ...
    sizes: tuple[tuple[int, ...], ...] = ()
    dtypes: tuple[str, ...] = ()
    entered_s: float = 0.0  # wall-clock time it was entered (time.time())

    def shape(self) -> str:
        if not self.sizes:
            return ""
        return ", ".join(f"{d}{list(s)}" for s, d in zip(self.sizes, self.dtypes or ("",) * len(self.sizes)))


@dataclass(frozen=True)
class GroupRecord:
    """A rank's view of one process group."""

    group: str  # "0" for the default group
    enqueued: int  # the last collective it entered (0: none)
    completed: int  # the last that completed (-1: not known, e.g. gloo's)
    entries: tuple[Collective, ...] = ()  # its last ones, oldest first

    def entry(self, seq: int) -> Collective | None:
        return next((e for e in self.entries if e.seq == seq), None)


@dataclass(frozen=True)
class RankDump:
    """What one rank wrote of its collectives, at ``time``."""

    rank: int
    host: str
    time: float
    reason: str  # request, timeout, stall, stop, end
    source: str  # "flight recorder" or "runner counter"
    groups: tuple[GroupRecord, ...] = ()
    at: str = ""  # where its main thread is: "train.py:57 in main"
    stuck: str = ""  # written by its host agent for a rank that cannot answer: why, in words

    def group(self, name: str) -> GroupRecord | None:
        return next((g for g in self.groups if g.group == name), None)

    def document(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_document(doc: Mapping[str, Any]) -> RankDump | None:
        """The dump a JSON document holds (:meth:`document`'s); None for one that is not a dump."""
        try:
            return _from_json(doc)
        except (KeyError, TypeError, ValueError):
            return None


def _from_json(doc: Mapping[str, Any]) -> RankDump:
    groups = tuple(GroupRecord(g["group"], g["enqueued"], g["completed"],
                               tuple(Collective(e["seq"], e["op"], tuple(tuple(s) for s in e.get("sizes", ())),
                                                tuple(e.get("dtypes", ())), e.get("entered_s", 0.0))
                                     for e in g.get("entries", ())))
                   for g in doc.get("groups", ()))
    return RankDump(doc["rank"], doc.get("host", ""), doc.get("time", 0.0), doc.get("reason", ""),
                    doc.get("source", ""), groups, doc.get("at", ""), doc.get("stuck", ""))
