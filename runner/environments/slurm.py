"""The Slurm environment: the one place that reads SLURM_* variables."""

from __future__ import annotations

import re
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


_PART = re.compile(r"([^\[\]]*)\[([^\[\]]*)\]")  # literal text, then one bracket: "node[" "01-04,07" "]"
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


def _numbers(ranges: str, nodelist: str) -> list[str]:
    """``01-04,07`` -> 01 02 03 04 07: each number as wide as its range's first one (Slurm pads to that)."""
    out = []
    for item in ranges.split(","):
        m = _RANGE.fullmatch(item.strip())
        if m is None or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
            raise ValueError(f"host list {nodelist!r}: {item!r} is not a number or a range low-high (low <= high)")
        low, high, width = int(m.group(1)), int(m.group(2) or m.group(1)), len(m.group(1))
        out.extend(f"{n:0{width}d}" for n in range(low, high + 1))
    return out


def _expand_one(name: str, nodelist: str) -> list[str]:
    """One host expression: text and bracketed ranges, the names of every combination, the first bracket varying
    slowest (``a[1-2]-b[3-4]`` -> a1-b3 a1-b4 a2-b3 a2-b4)."""
    names, at = [""], 0
    for m in _PART.finditer(name):
        if m.start() != at:
            break
        names = [f"{n}{m.group(1)}{number}" for n in names for number in _numbers(m.group(2), nodelist)]
        at = m.end()
    rest = name[at:]
    if "[" in rest or "]" in rest:
        raise ValueError(f"host list {nodelist!r}: unbalanced brackets in {name!r}")
    if at and rest:
        raise ValueError(f"host list {nodelist!r}: {name!r} has text after its last bracket, which Slurm refuses")
    return [n + rest for n in names]


def expand_hostnames(nodelist: str) -> list[str]:
    """A Slurm host list as Slurm's own ``scontrol show hostnames`` expands it, in this process: comma- (or space-)
    separated host expressions, each text and bracketed ranges with zero padding (``gpu-node[01-04,07]``,
    ``a[1-2]-b[3-4]``, ``n[8-10]``), in order, duplicates kept. Raises ValueError where Slurm says
    "Invalid hostlist"."""
    names: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(nodelist + ","):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if depth < 0 or depth > 1:
            raise ValueError(f"host list {nodelist!r}: unbalanced brackets")
        if depth == 0 and (ch == "," or ch.isspace()):
            if nodelist[start:i].strip():
                names.extend(_expand_one(nodelist[start:i].strip(), nodelist))
            start = i + 1
    if depth:
        raise ValueError(f"host list {nodelist!r}: unbalanced brackets")
    return names


@dataclass(frozen=True, kw_only=True)
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
        return cls(job_id=env.get("SLURM_JOB_ID"), step_id=env.get("SLURM_STEP_ID"),
                   num_nodes=_int(env.get("SLURM_JOB_NUM_NODES")), proc_id=_int(env.get("SLURM_PROCID")),
                   local_id=_int(env.get("SLURM_LOCALID")), node_id=_int(env.get("SLURM_NODEID")),
                   ntasks=_int(env.get("SLURM_NTASKS")),
                   step_nodelist=env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST"),
                   step_num_nodes=_int(env.get("SLURM_STEP_NUM_NODES")),
                   step_tasks_per_node=expand_counts(env.get("SLURM_STEP_TASKS_PER_NODE")),
                   job_nodelist=env.get("SLURM_JOB_NODELIST"),
                   cpus_per_node=expand_counts(env.get("SLURM_JOB_CPUS_PER_NODE")),
                   gpus_on_node=_int(env.get("SLURM_GPUS_ON_NODE")), node_name=env.get("SLURMD_NODENAME"),
                   restart_count=_int(env.get("SLURM_RESTART_COUNT")) or 0)

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
        """The step's first host: where node 0 (global rank 0) runs. Raises ValueError without a node list."""
        names = self.hostnames()
        if not names:
            raise ValueError("neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST names a node: is this a Slurm task?")
        return names[0]

    def port(self) -> int:
        """The master port of this job: derived from its id, so two jobs on one node do not collide."""
        return derived_port(int(self.job_id or 0))
