"""A validated job: the spec plus everything validation resolved (hosts, device, backend, master)."""

from __future__ import annotations

from dataclasses import dataclass, field

from runner.spec.schema import BackendName, DeviceKind, JobConfig, ParallelMode
from runner.spec.topology import Host


@dataclass(frozen=True)
class Job:
    spec: JobConfig
    hosts: tuple[Host, ...]
    device: DeviceKind  # cuda or cpu, never auto
    backend: BackendName  # nccl, gloo or mpi, never auto
    master_addr: str | None  # None: the launcher finds it at launch (first Slurm node, ...)
    spares: tuple[Host, ...] = field(default=())  # topology.spares: hosts kept ready (runner.spec.elastic)

    @property
    def world_size(self) -> int:
        """Processes in the job: one per device for DDP, one per host (a single one) for DP."""
        if self.spec.parallel.mode is ParallelMode.dp:
            return len(self.hosts)
        return sum(h.devices for h in self.hosts)

    @property
    def uniform(self) -> bool:
        return len({h.devices for h in self.hosts}) <= 1
