"""The record of one host's attempt: how its ranks ended (what the report, runner.worker.failures, the endings
across hosts, runner.worker.endings, and preflight's outcome read). A leaf: the host agent fills it, the readers
import it and not the agent."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from runner.worker.channel_records import JobFailure
from runner.worker.rank_life import Stuck


@dataclass
class HostEnding:
    """How a host's ranks ended: what the report (runner.worker.failures) and preflight read. Every rank is named
    by its global rank (runner.worker.setup.by_rank finds its setup)."""

    codes: dict[int, int]  # rank -> exit status (the code, or -N: killed by signal N)
    order: list[int]  # the ranks in the order their processes exited
    stopped: set[int] = field(default_factory=set)  # the ones the agent signalled to end (a failure, a signal)
    signum: int | None = None  # a SIGINT or SIGTERM that reached the agent and stopped the ranks
    requested: bool = False  # a stop request reached the agent and was passed on (runner.common.signals)
    peer_failed: JobFailure | None = None  # the job's first failure was another host's (or no rank's)
    earlier: JobFailure | None = None  # this host's rank failed, but another host's had failed before it
    ended_at: dict[int, float] = field(default_factory=dict)  # rank -> when the agent saw its process end
    stuck: dict[int, Stuck] = field(default_factory=dict)  # rank -> one the end guard ended (runner.worker.rank_life)
    began: float = field(default_factory=time.time)  # when the attempt's ranks started
    returned_at: dict[int, float] = field(default_factory=dict)  # rank -> when its script or recipe returned

    def _bad(self, i: int) -> bool:
        """Rank ``i`` ended badly: a failure status, unless its work was over and the end guard ended it."""
        return bool(self.codes[i]) and not (i in self.stuck and self.stuck[i].work_done)

    @property
    def failed(self) -> bool:
        return any(self._bad(i) for i in self.codes)

    def failed_by_itself(self) -> bool:
        """A rank ended badly that the agent had not signalled (a failure, not a stop)."""
        return any(self._bad(i) and i not in self.stopped for i in self.codes)

    def first_failure(self) -> int | None:
        """The first rank that failed by itself (not one the agent stopped), else None."""
        return next((i for i in self.order if self._bad(i) and i not in self.stopped), None)
