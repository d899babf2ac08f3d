"""runner.environments.slurm: Slurm's variables of a step or an allocation, and only theirs (patched environments;
node lists are expanded by Slurm's own scontrol, in test_slurm_cluster.py)."""

from __future__ import annotations

import pytest

from runner.environments.slurm import SlurmEnvironment, expand_counts

pytestmark = pytest.mark.unit


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


@pytest.mark.parametrize("value, counts", [("2(x3),1", (2, 2, 2, 1)), ("4", (4,)), ("", None), (None, None),
                                           ("2(x", None)])
def test_slurms_compressed_counts_per_node(value, counts) -> None:
    assert expand_counts(value) == counts
