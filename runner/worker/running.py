"""One attempt's ranks once they run, as the host agent's monitor, executor and diagnostics all see them: their
processes, setups and output, the job's channel, the plan and run folder of the attempt. A plain record: what the
attempt remembers is its state machine's (runner.worker.attempt_state), not this."""

from __future__ import annotations

from dataclasses import dataclass

from runner.plan.processes import Plan
from runner.records.paths import RunPaths
from runner.worker.channel import JobChannel
from runner.worker.relay import OutputRelay
from runner.worker.setup import RankSetup
from runner.worker.zygote import RankProcess


@dataclass(frozen=True, kw_only=True)
class Running:
    """The attempt's ranks (``ranks``: their processes, in the order of their ``setups``) and what they run with;
    ``serves``: this agent serves the job's store (host 0's)."""

    plan: Plan
    paths: RunPaths
    setups: tuple[RankSetup, ...]
    ranks: tuple[RankProcess, ...]
    relay: OutputRelay
    channel: JobChannel | None
    node_rank: int
    serves: bool

    @property
    def host(self) -> str:
        """This host's name, as the job's channel names it."""
        return self.setups[0].place.host if self.setups else f"node {self.node_rank}"

    def number(self, rank: RankProcess) -> int:
        """A rank process's global rank."""
        return self.setups[rank.index].place.global_rank

    def by_number(self) -> dict[int, RankProcess]:
        """Each rank's process, by its global rank."""
        return {self.number(rank): rank for rank in self.ranks}
