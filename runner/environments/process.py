"""What the runner reads of the environment of its own process: read once, at an entry point (`run`, a task a
scheduler started), into one object that is passed down; nothing below reads ``os.environ`` itself."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from runner.environments.mpi import MpiEnvironment
from runner.environments.slurm import SlurmEnvironment

SOCKET_IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
VARIABLES = {
    "OMP_NUM_THREADS": "threads per process; set by the user, the runner keeps it (else cores / processes)",
    "GLOO_SOCKET_IFNAME": "gloo's interface; set by the user, the runner's choice is off",
    "NCCL_SOCKET_IFNAME": "NCCL's interface; as GLOO_SOCKET_IFNAME",
    "TORCH_FR_BUFFER_SIZE": "torch's flight recorder entries; set by the user, it wins over log.collectives",
    "RUNNER_ATTEMPT": "the attempt an mpirun task belongs to (launcher=mpi starts mpirun again to restart)",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "NCCL's error handling; set by the user, the runner keeps it (else 1, as torchrun)",
}


@dataclass(frozen=True, kw_only=True)
class ProcessEnvironment:
    """This process's environment as the runner needs it: its own variables (:data:`VARIABLES`), Slurm's
    (:class:`SlurmEnvironment`) and an MPI launcher's (:class:`MpiEnvironment`, None outside mpirun)."""

    slurm: SlurmEnvironment
    mpi: MpiEnvironment | None
    omp_num_threads: str | None = None
    socket_ifnames: Mapping[str, str] = field(default_factory=dict)  # the user's GLOO/NCCL_SOCKET_IFNAME
    cpu_count: int = 1  # the CPUs this process may use: its affinity (taskset, Slurm, cgroup cpusets), its CPU quota
    flight_recorder: str | None = None  # the user's TORCH_FR_BUFFER_SIZE
    attempt: int = 0  # RUNNER_ATTEMPT: set by launcher=mpi for the tasks of a restarted job
    nccl_async_error_handling: str | None = None  # the user's TORCH_NCCL_ASYNC_ERROR_HANDLING
    exported: Mapping[str, str] = field(default_factory=dict, repr=False)  # with_exported's values

    def with_exported(self, names: Iterable[str], env: Mapping[str, str] | None = None) -> ProcessEnvironment:
        """This environment with the values here of the variables ``names`` that the spec names to pass on to other
        hosts (launcher.ssh.export), read by name once the spec is known; unset ones are left out."""
        env = os.environ if env is None else env
        return dataclasses.replace(self, exported={n: env[n] for n in names if n in env})

    @classmethod
    def read(cls, env: Mapping[str, str] | None = None) -> ProcessEnvironment:
        env = os.environ if env is None else env
        return cls(slurm=SlurmEnvironment.read(env), mpi=MpiEnvironment.read(env),
                   omp_num_threads=env.get("OMP_NUM_THREADS") or None,
                   socket_ifnames={v: env[v] for v in SOCKET_IFNAME_VARIABLES if env.get(v)}, cpu_count=usable_cpus(),
                   flight_recorder=env.get("TORCH_FR_BUFFER_SIZE") or None,
                   attempt=int(env.get("RUNNER_ATTEMPT") or 0),
                   nccl_async_error_handling=env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING") or None)


def usable_cpus() -> int:
    """The CPUs this process may run on: those of its affinity mask (taskset, a Slurm task's CPUs, a cpuset), no more
    than its cgroup's CPU quota allows (a container's ``--cpus``); not the machine's count."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
    quota = _cgroup_cpu_quota()
    if quota is not None:
        count = min(count, max(1, math.ceil(quota)))
    return max(1, count)


def _cgroup_cpu_quota(root: Path = Path("/sys/fs/cgroup"), self_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """CPUs' worth of time this process's cgroup may use per period (cgroup v2 ``cpu.max``, v1
    ``cpu.cfs_quota_us``/``cfs_period_us``); None: no quota."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one hierarchy
            try:
                quota, period = (root / path.lstrip("/") / "cpu.max").read_text().split()
            except (OSError, ValueError):
                continue
            if quota != "max":
                return int(quota) / int(period)
        elif "cpu" in controllers.split(","):  # v1
            base = root / "cpu" / path.lstrip("/")
            try:
                quota_us = int((base / "cpu.cfs_quota_us").read_text())
                period_us = int((base / "cpu.cfs_period_us").read_text())
            except (OSError, ValueError):
                continue
            if quota_us > 0 and period_us > 0:
                return quota_us / period_us
    return None
