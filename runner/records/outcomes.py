"""How each rank of a run ended, as files in the run's ``logs/`` folder (named by runner.records.paths.RankPaths):
the one module that writes and reads them.

* ``rank<r>.joined`` — the rank joined the default process group (a rendezvous that times out names the
  ranks without one); it holds the backend the group uses (a script chooses its own);
* ``rank<r>.done`` — its recipe returned: JSON ``{"stopped": bool, "result": {...}}``, ``stopped`` when it
  returned because it was asked to (and checkpointed), ``result`` what the recipe returned (a mapping of
  plain values; ``{}`` otherwise); and ``"ended"``, where its work was over but its process did not end by itself and
  its agent ended it (runner.worker.rank_life), in words;
* ``rank<r>.error.json`` — it raised (written by the rank), or its launcher saw it die without a Python
  exception (``"killed": true``, written by the launcher): :class:`ErrorRecord`'s fields.

The ranks write them, the launchers and the reports read them; the files outlive the processes, so a run
folder tells how its ranks ended after the fact (a Slurm job Slurm no longer remembers, a sweep's table).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from runner.common.files import write_atomically
from runner.common.timeouts import is_timeout_text
from runner.records.paths import RankPaths, RunPaths


@dataclass(frozen=True, kw_only=True)
class ErrorRecord:
    """Why a rank failed, where and when: a rank's ``rank<r>.error.json`` (:meth:`to_json`, :meth:`from_json`), and
    the record of a rank on another host that the job's channel carries (runner.worker.endings)."""

    rank: int
    local_rank: int
    host: str  # as the plan names it (every namespace host of a test bed has the machine's name)
    machine: str | None  # the machine's own name; None when its launcher wrote the record
    pid: int | None
    timestamp: float
    exception: str  # "RuntimeError: ...", or how the process ended ("killed by SIGKILL (no Python exception)")
    traceback: str = ""
    killed: bool = False  # died without a Python exception; its launcher wrote this
    timeout: bool = False  # torch.distributed timed out (runner.common.timeouts), as the rank saw the exception
    first: bool = False  # its host agent's report named it the first failure (the run's summary names the same)


    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_document(cls, doc: object) -> ErrorRecord | None:
        """The record a JSON document holds (unknown keys ignored; a record written before ranks said whether they
        timed out, an older run folder's, is judged by its text); None: it holds none."""
        if not isinstance(doc, dict):
            return None
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in doc.items() if k in known}
        values.setdefault("timeout", is_timeout_text(str(doc.get("exception", ""))))
        try:
            return cls(**values)
        except TypeError:  # a required field missing
            return None

    @classmethod
    def from_json(cls, text: str) -> ErrorRecord | None:
        try:
            return cls.from_document(json.loads(text))
        except ValueError:
            return None


def timed_out(error: ErrorRecord) -> bool:
    """Whether an error record is a timeout of torch.distributed (the rank's verdict)."""
    return error.timeout


@dataclass(frozen=True)
class RankOutcome:
    """The outcome files of one rank of a run (of the run's current attempt: each attempt has its logs)."""

    paths: RunPaths
    rank: int

    @property
    def files(self) -> RankPaths:
        return self.paths.rank(self.rank)

    @property
    def error_file(self) -> Path:
        return self.files.error

    @property
    def done_file(self) -> Path:
        return self.files.done

    @property
    def joined_file(self) -> Path:
        return self.files.joined

    # -- written by the rank (or, for a rank that could not, by its launcher) ----------------------------
    def clear(self) -> None:
        """Forget an earlier attempt's files of this rank (a restarted or requeued job)."""
        for path in (self.error_file, self.done_file, self.joined_file):
            path.unlink(missing_ok=True)

    def mark_joined(self, backend: str = "") -> None:
        write_atomically(self.joined_file, backend)

    def mark_done(self, stopped: bool, result: Mapping[str, Any] | None = None, ended: str | None = None) -> None:
        document: dict[str, Any] = {"stopped": stopped, "result": dict(result or {})}
        if ended:
            document["ended"] = ended
        write_atomically(self.done_file, json.dumps(document))

    def mark_ended_after_its_work(self, text: str) -> None:
        """Its work was over, its process did not end, and its agent ended it (``text`` says so): it counts as done,
        with what it had recorded of its result."""
        self.mark_done(self.returned_on_request, self.result, ended=text)

    def record_error(self, record: ErrorRecord) -> None:
        write_atomically(self.error_file, record.to_json())

    def mark_first_failure(self) -> None:
        """Its host agent's report named this rank's failure the first (see :func:`first_failures`)."""
        error = self.error()
        if error is not None:
            self.record_error(replace(error, first=True))

    # -- read by launchers and reports ------------------------------------------------------------------
    @property
    def joined(self) -> bool:
        return self.joined_file.exists()

    @property
    def backend(self) -> str | None:
        """The backend of the process group it joined (None: it joined none, or an older run folder)."""
        try:
            return self.joined_file.read_text().strip() or None
        except OSError:
            return None

    @property
    def done(self) -> bool:
        return self.done_file.exists()

    @property
    def failed(self) -> bool:
        return self.error_file.exists()

    def _done_document(self) -> dict[str, Any]:
        try:
            document = json.loads(self.done_file.read_text() or "{}")
        except (OSError, ValueError):
            return {}
        return document if isinstance(document, dict) else {}

    @property
    def returned_on_request(self) -> bool:
        """Its recipe returned because it was asked to stop (and checkpointed), not at the end of its work."""
        return bool(self._done_document().get("stopped"))

    @property
    def ended_by_its_agent(self) -> str | None:
        """How its agent ended it after its work (``mark_ended_after_its_work``); None: it ended by itself."""
        text = self._done_document().get("ended")
        return str(text) if text else None

    @property
    def result(self) -> dict[str, Any]:
        """What its recipe returned (a mapping; {} when it returned something else, or has not returned)."""
        result = self._done_document().get("result")
        return result if isinstance(result, dict) else {}

    def error(self) -> ErrorRecord | None:
        """Its error record, or None."""
        try:
            return ErrorRecord.from_json(self.error_file.read_text())
        except OSError:
            return None


def outcomes(paths: RunPaths, ranks: Iterable[int]) -> list[RankOutcome]:
    return [RankOutcome(paths, r) for r in ranks]


def first_failures(paths: RunPaths, ranks: Iterable[int]) -> list[ErrorRecord]:
    """The error records of ``ranks``, the first failure first: the one its host agent's report named first (it saw
    the processes end, in one clock), then ranks killed by a signal (the peers that lost them fail after them, with
    errors about the lost peer), then ranks that raised, by time."""
    records = (o.error() for o in outcomes(paths, ranks))
    return sorted((e for e in records if e), key=lambda e: (not e.first, not e.killed, e.timestamp))


def all_done(paths: RunPaths, ranks: Iterable[int]) -> bool:
    return all(o.done for o in outcomes(paths, ranks))


def any_failed(paths: RunPaths, ranks: Iterable[int]) -> bool:
    return any(o.failed for o in outcomes(paths, ranks))
