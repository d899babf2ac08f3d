"""runner.environments.mpi: an MPI launcher's variables, whichever MPI set them, and only theirs (patched
environments, no processes)."""

from __future__ import annotations

import pytest

from runner.environments.mpi import MpiEnvironment

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("env, flavour, expected", [
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, "Open MPI", (3, 4, 1, 2)),
    ({"MV2_COMM_WORLD_RANK": "2", "MV2_COMM_WORLD_SIZE": "3", "MV2_COMM_WORLD_LOCAL_RANK": "0"}, "MVAPICH", (2, 3, 0, None)),
    ({"PMI_RANK": "5", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4"}, "MPICH / Intel MPI (PMI)",
     (5, 8, 1, 4)),
])
def test_mpi_flavours(env, flavour, expected):
    mpi = MpiEnvironment.read(env)
    assert mpi.flavour == flavour and (mpi.rank, mpi.size, mpi.local_rank, mpi.local_size) == expected


def test_no_mpi():
    assert MpiEnvironment.read({"RANK": "0", "WORLD_SIZE": "2", "SLURM_PROCID": "0"}) is None
