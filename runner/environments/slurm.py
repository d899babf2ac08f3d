"""The Slurm environment: the one place that reads SLURM_* variables."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

VARIABLES = {
    "SLURM_JOB_ID": "id of the allocation (job)",
    "SLURM_STEP_ID": "id of the step; set only inside srun",
    "SLURM_PROCID": "global task index of this task in the step",
    "SLURM_LOCALID": "task index on this node",
    "SLURM_NODEID": "index of this node in the step",
    "SLURM_NTASKS": "tasks in the step",
    "SLURM_JOB_NUM_NODES": "nodes in the allocation",
    "SLURM_STEP_NODELIST": "nodes of the step (compressed: gpu-node[01-04])",
    "SLURM_JOB_NODELIST": "nodes of the allocation",
}


@dataclass(frozen=True)
class SlurmEnvironment:
    job_id: str | None
    step_id: str | None
    num_nodes: int | None

    @classmethod
    def read(cls, env: Mapping[str, str]) -> "SlurmEnvironment":
        nodes = env.get("SLURM_JOB_NUM_NODES")
        return cls(env.get("SLURM_JOB_ID"), env.get("SLURM_STEP_ID"), int(nodes) if nodes else None)

    @property
    def in_allocation(self) -> bool:
        """Inside salloc or a batch script: a launch here is an srun step, not a new submission."""
        return self.job_id is not None
