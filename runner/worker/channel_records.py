"""The records the job's channel carries between hosts (runner.worker.channel), each a frozen keyword-only dataclass
with its one codec (``document()`` to the JSON-able form the store keeps, ``from_document()`` back, None for what is
not one): the job's first failure, a stop asked for, and how a rank ended. A leaf: the channel, the host agent and
the endings import it; it imports none of them."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from runner.records.outcomes import ErrorRecord


@dataclass(frozen=True, kw_only=True)
class JobFailure:
    """The job's first failure, as a host said it: its rank's (``rank``), or the host's own (``rank`` None: it was
    lost, its `run` ended badly, or its agent's stall watchdog ended the job: ``stall``)."""

    rank: int | None
    host: str
    text: str
    time: float = field(default_factory=time.time)
    stall: bool = False

    def document(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_document(cls, doc: object) -> JobFailure | None:
        if not isinstance(doc, dict) or not isinstance(doc.get("host"), str):
            return None
        rank = doc.get("rank")
        return cls(rank=rank if isinstance(rank, int) else None, host=doc["host"], text=str(doc.get("text", "")),
                   time=float(doc.get("time") or 0.0), stall=bool(doc.get("stall", False)))


@dataclass(frozen=True, kw_only=True)
class StopAsked:
    """A host's `run` (or agent) got ``signal`` (Ctrl-C, SIGTERM, the stop signal), for every host."""

    signal: int
    host: str
    time: float = field(default_factory=time.time)

    def document(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_document(cls, doc: object) -> StopAsked | None:
        if not isinstance(doc, dict) or not isinstance(doc.get("signal"), int):
            return None
        return cls(signal=doc["signal"], host=str(doc.get("host") or "another host"),
                   time=float(doc.get("time") or 0.0))


@dataclass(frozen=True, kw_only=True)
class RankReturned:
    """A rank's recipe or script returned: on request (``stopped``), with what it returned, and how its agent
    ended it after its work, if it did (runner.records.outcomes' done file)."""

    stopped: bool
    result: dict[str, Any]
    ended: str | None = None


@dataclass(frozen=True, kw_only=True)
class RankEnding:
    """How one rank ended, as its host agent puts it on the channel for host 0 (runner.worker.endings)."""

    host: str
    code: int | None  # its exit status (-N: killed by signal N); None: never seen to end
    stopped: bool  # its agent signalled it to end
    error: ErrorRecord | None
    returned: RankReturned | None
    joined: str | None  # the backend of the process group it joined; None: it joined none
    end_dump: dict[str, Any] | None  # its last dump, written at its end (runner.records.dumps.RankDump's document)

    def document(self) -> dict[str, Any]:
        return {"host": self.host, "code": self.code, "stopped": self.stopped,
                "error": asdict(self.error) if self.error is not None else None,
                "done": asdict(self.returned) if self.returned is not None else None,
                "joined": self.joined, "end_dump": self.end_dump}

    @classmethod
    def from_document(cls, doc: object) -> RankEnding | None:
        if not isinstance(doc, dict):
            return None
        done = doc.get("done")
        returned = RankReturned(stopped=bool(done.get("stopped")), result=done.get("result") or {},
                                ended=done.get("ended")) if isinstance(done, dict) else None
        code = doc.get("code")
        return cls(host=str(doc.get("host", "")), code=code if isinstance(code, int) else None,
                   stopped=bool(doc.get("stopped")), error=ErrorRecord.from_document(doc.get("error")),
                   returned=returned, joined=str(doc["joined"]) if doc.get("joined") is not None else None,
                   end_dump=doc["end_dump"] if isinstance(doc.get("end_dump"), dict) else None)


@dataclass(frozen=True, kw_only=True)
class DumpRequest:
    """Every rank is asked to say where it is (a request made at ``time``, for ``reason``: Ctrl-\\, a timeout, a
    stop, a stall)."""

    time: float
    reason: str

    def document(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_document(cls, doc: object) -> DumpRequest | None:
        if not isinstance(doc, dict) or not isinstance(doc.get("time"), (int, float)):
            return None
        return cls(time=float(doc["time"]), reason=str(doc.get("reason", "request")))
