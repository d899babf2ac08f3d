"""What the runner reads of the environment of its own process: read once, at an entry point (`run`, a task a
scheduler started), into one object that is passed down; nothing below reads ``os.environ`` itself."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from runner.environments.mpi import MpiEnvironment
from runner.environments.slurm import SlurmEnvironment

SOCKET_IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
VARIABLES = {
    "OMP_NUM_THREADS": "threads per process; set by the user, the runner keeps it (else cores / processes)",
    "GLOO_SOCKET_IFNAME": "gloo's interface; set by the user, the runner's choice is off",
    "NCCL_SOCKET_IFNAME": "NCCL's interface; as GLOO_SOCKET_IFNAME",
    "TORCH_FR_BUFFER_SIZE": "torch's flight recorder entries; set by the user, it wins over log.collectives",
    "RUNNER_ATTEMPT": "the attempt an mpirun task belongs to (launcher=mpi starts mpirun again to restart)",
}


@dataclass(frozen=True)
class ProcessEnvironment:
    """This process's environment as the runner needs it: its own variables (:data:`VARIABLES`), Slurm's
    (:class:`SlurmEnvironment`) and an MPI launcher's (:class:`MpiEnvironment`, None outside mpirun)."""

    slurm: SlurmEnvironment
    mpi: MpiEnvironment | None
    omp_num_threads: str | None = None
    socket_ifnames: Mapping[str, str] = field(default_factory=dict)  # the user's GLOO/NCCL_SOCKET_IFNAME
    cpu_count: int = 1
    flight_recorder: str | None = None  # the user's TORCH_FR_BUFFER_SIZE
    attempt: int = 0  # RUNNER_ATTEMPT: set by launcher=mpi for the tasks of a restarted job

    @classmethod
    def read(cls, env: Mapping[str, str] | None = None) -> ProcessEnvironment:
        env = os.environ if env is None else env
        return cls(SlurmEnvironment.read(env), MpiEnvironment.read(env), env.get("OMP_NUM_THREADS") or None,
                   {v: env[v] for v in SOCKET_IFNAME_VARIABLES if env.get(v)}, os.cpu_count() or 1,
                   env.get("TORCH_FR_BUFFER_SIZE") or None, int(env.get("RUNNER_ATTEMPT") or 0))
