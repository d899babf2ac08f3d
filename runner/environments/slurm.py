"""The Slurm environment: the one place that reads SLURM_* variables."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field

from runner.plan.processes import derived_port

VARIABLES = {
    "SLURM_JOB_ID": "id of the allocation (job)",
    "SLURM_STEP_ID": "id of the step; set only inside srun",
    "SLURM_PROCID": "global task index of this task in the step",
    "SLURM_LOCALID": "task index on this node",
    "SLURM_NODEID": "index of this node in the step",
    "SLURM_NTASKS": "tasks in the step",
    "SLURM_STEP_NUM_NODES": "nodes of the step",
    "SLURM_STEP_TASKS_PER_NODE": "tasks on each node of the step (compressed: 2(x2),1)",
    "SLURM_STEP_NODELIST": "nodes of the step (compressed: gpu-node[01-04])",
    "SLURM_JOB_NUM_NODES": "nodes in the allocation",
    "SLURM_JOB_NODELIST": "nodes of the allocation",
    "SLURM_JOB_CPUS_PER_NODE": "CPUs the allocation has on each node (compressed: 8(x2),4)",
    "SLURM_GPUS_ON_NODE": "GPUs the allocation has on this node",
    "SLURMD_NODENAME": "name of the node this task runs on",
    "SLURM_RESTART_COUNT": "times the job was requeued",
}


def _int(value: str | None) -> int | None:
    return int(value) if value not in (None, "") else None


def expand_counts(value: str | None) -> tuple[int, ...] | None:
    """Slurm's compressed per-node counts: ``2(x3),1`` -> (2, 2, 2, 1)."""
    if not value:
        return None
    counts: list[int] = []
    for part in value.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if m is None:
            return None
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return tuple(counts)


def expand_hostnames(nodelist: str) -> list[str]:
    """A node list expanded by Slurm itself (``gpu-node[01-04]``, ``a[1-2],b3``): never split by hand."""
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True)
    if out.returncode != 0 or not out.stdout.split():
        raise RuntimeError(f"`scontrol show hostnames {nodelist}` failed: {out.stderr.strip() or 'no output'}")
    return out.stdout.split()


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
    step_num_nodes: int | None = None
    step_tasks_per_node: tuple[int, ...] | None = None
    job_nodelist: str | None = None
    cpus_per_node: tuple[int, ...] | None = None
    gpus_on_node: int | None = None
    node_name: str | None = None
    restart_count: int = 0
    _names: list[str] = field(default_factory=list, compare=False, repr=False)

    @classmethod
    def read(cls, env: Mapping[str, str]) -> "SlurmEnvironment":
        return cls(env.get("SLURM_JOB_ID"), env.get("SLURM_STEP_ID"), _int(env.get("SLURM_JOB_NUM_NODES")),
                   _int(env.get("SLURM_PROCID")), _int(env.get("SLURM_LOCALID")), _int(env.get("SLURM_NODEID")),
                   _int(env.get("SLURM_NTASKS")), env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST"),
                   _int(env.get("SLURM_STEP_NUM_NODES")), expand_counts(env.get("SLURM_STEP_TASKS_PER_NODE")),
                   env.get("SLURM_JOB_NODELIST"), expand_counts(env.get("SLURM_JOB_CPUS_PER_NODE")),
                   _int(env.get("SLURM_GPUS_ON_NODE")), env.get("SLURMD_NODENAME"),
                   _int(env.get("SLURM_RESTART_COUNT")) or 0)

    @property
    def in_step(self) -> bool:
        """Inside an srun step: a task with a place of its own."""
        return self.step_id is not None and self.proc_id is not None

    @property
    def in_allocation(self) -> bool:
        """Inside salloc or a batch script: a launch here is an srun step, not a new submission."""
        return self.job_id is not None

    def hostnames(self) -> list[str]:
        """The step's (or allocation's) nodes, in order."""
        if not self._names:
            self._names.extend(expand_hostnames(self.step_nodelist or ""))
        return self._names

    def first_host(self) -> str:
        """The step's first host: where node 0 (global rank 0) runs."""
        return self.hostnames()[0]

    def port(self) -> int:
        """The master port of this job: derived from its id, so two jobs on one node do not collide."""
        return derived_port(int(self.job_id or 0))
