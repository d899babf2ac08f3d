"""The environment classes read their variables, and only theirs (patched environments, no processes)."""

from __future__ import annotations

import pytest

from runner.environments.mpi import MpiEnvironment
from runner.environments.slurm import SlurmEnvironment

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


def test_slurm_step_and_allocation():
    step = SlurmEnvironment.read({"SLURM_JOB_ID": "12345", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3",
                                  "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_NTASKS": "4",
                                  "SLURM_JOB_NUM_NODES": "2", "SLURM_STEP_NODELIST": "gpu-node[01-02]"})
    assert step.in_allocation and step.in_step
    assert (step.proc_id, step.local_id, step.node_id, step.ntasks, step.num_nodes) == (3, 1, 1, 4, 2)
    assert step.step_nodelist == "gpu-node[01-02]"
    assert step.port() == 20000 + 12345 % 10000
    allocation = SlurmEnvironment.read({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "a[1-2],b3"})
    assert allocation.in_allocation and not allocation.in_step and allocation.step_nodelist == "a[1-2],b3"
    assert not SlurmEnvironment.read({}).in_allocation
