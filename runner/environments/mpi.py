"""The MPI environment: the one place that reads an MPI launcher's rank variables."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# (global rank, world size, local rank, local size) as each MPI flavour names them, in detection order
VARIABLES = {
    "Open MPI": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    "MVAPICH": ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"),
    "MPICH / Intel MPI (PMI)": ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
}


@dataclass(frozen=True, kw_only=True)
class MpiEnvironment:
    flavour: str
    rank: int
    size: int
    local_rank: int | None
    local_size: int | None

    @classmethod
    def read(cls, env: Mapping[str, str]) -> "MpiEnvironment | None":
        for flavour, (rank, size, local_rank, local_size) in VARIABLES.items():
            if rank in env and size in env:
                local = env.get(local_rank)
                nlocal = env.get(local_size)
                return cls(flavour=flavour, rank=int(env[rank]), size=int(env[size]),
                           local_rank=int(local) if local is not None else None,
                           local_size=int(nlocal) if nlocal is not None else None)
        return None
