"""Where one process of a job runs: one descriptor, made by the plan (runner.plan.processes, one per process),
carried by the worker's RankSetup (runner.worker.setup), and read by the run context (runner.training.context) and
the sharding strategies (runner.training.sharding)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class RankPlace:
    """One process of the job: its ranks, its host, its device."""

    global_rank: int  # 0 .. world_size - 1
    local_rank: int  # 0 .. local_world_size - 1, on its host
    node_rank: int  # its host's index in the topology
    world_size: int  # processes in the job
    local_world_size: int  # processes on its host
    host: str  # the host's name, or node<i> when the launcher picks the machine
    device: str  # a torch device's name: "cpu", "cuda:<i>" (index among the host's visible GPUs)
    device_ids: tuple[int, ...]  # visible GPU indices this process uses (DP: all of the host's); () on CPU

    @property
    def is_main(self) -> bool:
        """Global rank 0: the process that logs metrics and writes checkpoints."""
        return self.global_rank == 0
