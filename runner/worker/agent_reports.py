"""What a host agent reports of its share as it runs, to whoever started it and asked (``HostAgent.reporter``), and
how: as whole lines of its process's stderr that begin with :data:`REPORT`, which the launch that reads that stderr
takes out of what it shows. launcher=ssh's hosts send them to the launching `run` (runner.launchers.ssh.session),
launcher=slurm's tasks to the `run` that holds the job's srun steps (runner.launchers.slurm.rounds); both record what
a lost host cost (runner.launchers.elastic.rounds). A Slurm task also says :class:`Alive` every few seconds, from a
thread of its own: a node whose tasks fall silent is lost.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class AttemptBegan:
    """The host's ranks of ``attempt`` started (``at``: the host's wall clock)."""

    attempt: int
    at: float
    host: int | None = None  # the node rank of the host that says it, where the reader cannot tell (srun's output)


@dataclass(frozen=True, kw_only=True)
class StepReached:
    """Rank 0's progress bar is at ``step`` in ``attempt``; ``resumed``: the step the attempt began at, from the copy
    of the checkpoint that ``copy_host`` held (save ``copy_save`` of the run)."""

    attempt: int
    step: int
    resumed: int | None
    at: float
    host: int | None = None
    copy_host: str | None = None
    copy_save: int | None = None


@dataclass(frozen=True, kw_only=True)
class Alive:
    """The task of host ``host`` is there (said every few seconds, whatever its ranks do)."""

    at: float
    host: int | None = None


@dataclass(frozen=True, kw_only=True)
class Leaving:
    """The host leaves the job: its `run` got SIGTERM of its own (a preempted machine, not one the launching `run`
    passed on), its ranks stopping with a checkpoint; or (``preempted`` false) the data-network check before an attempt
    named it (runner.worker.pair_check), before its ranks started. In a job that outlives its hosts the others go on
    without it."""

    at: float
    why: str = "SIGTERM to its `run`"
    host: int | None = None
    preempted: bool = True


AgentReport = AttemptBegan | StepReached | Alive | Leaving
_KINDS: dict[str, type] = {"attempt": AttemptBegan, "step": StepReached, "alive": Alive, "leaving": Leaving}

REPORT = b"\x1erunner-report "  # the start of a report line (an ASCII record separator: no program's output)


def report_line(report: AgentReport) -> bytes:
    kind = next(k for k, cls in _KINDS.items() if isinstance(report, cls))
    return REPORT + json.dumps({"k": kind, **dataclasses.asdict(report)}).encode() + b"\n"


def parse_report(line: bytes) -> AgentReport | None:
    """A report line's report (:data:`REPORT` and a JSON object); None for any other line."""
    if not line.startswith(REPORT):
        return None
    try:
        found = json.loads(line[len(REPORT):])
        return _KINDS[found.pop("k")](**found)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def say_report(report: AgentReport) -> None:
    """``report`` as a line of this process's stderr, written whole (one write: no rank's line cuts it); nothing where
    whoever read that stream is gone (the share is stopping anyway)."""
    try:
        os.write(2, report_line(report))
    except OSError:
        pass
