"""What a host agent reports of its share as it runs, to whoever started it and asked (``HostAgent.reporter``):
launcher=ssh's hosts send them to the launching `run` (runner.launchers.ssh.protocol), which records what a lost
host cost (runner.launchers.ssh.membership)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class AttemptBegan:
    """The host's ranks of ``attempt`` started (``at``: the host's wall clock)."""

    attempt: int
    at: float


@dataclass(frozen=True, kw_only=True)
class StepReached:
    """Rank 0's progress bar is at ``step`` in ``attempt``; ``resumed``: the step the attempt began at."""

    attempt: int
    step: int
    resumed: int | None
    at: float


AgentReport = AttemptBegan | StepReached
