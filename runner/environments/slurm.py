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


def _int(value: str | None) -> int | None:
    return int(value) if value not in (None, "") else None


@dataclass(frozen=True)
class SlurmEnvironment:
    job_id: str | None
    step_id: str | None
    num_nodes: int | None
    proc_id: int | None = None
    local_id: int | None = None
    node_id: int | None = None
    ntasks: int | None = None
    step_nodelist: str | None = None

    @classmethod
    def read(cls, env: Mapping[str, str]) -> "SlurmEnvironment":
        return cls(env.get("SLURM_JOB_ID"), env.get("SLURM_STEP_ID"), _int(env.get("SLURM_JOB_NUM_NODES")),
                   _int(env.get("SLURM_PROCID")), _int(env.get("SLURM_LOCALID")), _int(env.get("SLURM_NODEID")),
                   _int(env.get("SLURM_NTASKS")), env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST"))

    @property
    def in_step(self) -> bool:
        """Inside an srun step: a task with a place of its own."""
        return self.step_id is not None and self.proc_id is not None

    def first_host(self) -> str:
        """The step's first host, expanded by Slurm itself (`gpu-node[01-04]`, `a[1-2],b3`, ...)."""
        import subprocess

        out = subprocess.run(["scontrol", "show", "hostnames", self.step_nodelist or ""], capture_output=True,
                             text=True, check=True).stdout.split()
        return out[0]

    def port(self) -> int:
        """The master port of this job: derived from its id, so two jobs on one node do not collide."""
        return 20000 + int(self.job_id or 0) % 10000

    @property
    def in_allocation(self) -> bool:
        """Inside salloc or a batch script: a launch here is an srun step, not a new submission."""
        return self.job_id is not None
