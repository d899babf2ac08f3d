"""runner.launchers.slurm.rules: the job checked for Slurm, and an allocation checked for the job (each problem
names both numbers and the salloc that fits). launcher.slurm's options are rows of tests/spec/test_validation.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import validate
from runner.environments.slurm import SlurmEnvironment
from runner.launchers import plan_for
from runner.launchers.slurm.rules import allocation_problems, job_problems, spec_problems
from runner.plan.processes import Plan
from runner.records.paths import RunPaths

pytestmark = pytest.mark.unit


def _plan(*overrides: str) -> Plan:
    checked = validate(["launcher=slurm", "device=cpu", *overrides])
    assert checked.job is not None, checked.problems
    return plan_for(checked.job, RunPaths(Path("/runs/R1"), "R1"))


def _allocation(**variables: str) -> SlurmEnvironment:
    return SlurmEnvironment.read({"SLURM_JOB_ID": "42", **variables})


def test_an_allocation_that_fits_has_no_problems():
    assert allocation_problems(_plan("topology=2x2"), _allocation(SLURM_JOB_NUM_NODES="2",
                                                                  SLURM_JOB_CPUS_PER_NODE="4(x2)")) == []


def test_too_few_nodes_says_both_numbers_and_the_fix():
    (problem,) = allocation_problems(_plan("topology=2x2"),
                                     _allocation(SLURM_JOB_NUM_NODES="1", SLURM_JOB_CPUS_PER_NODE="8"))
    assert "has 1 node(s) (SLURM_JOB_NUM_NODES), the spec needs 2" in problem.message
    assert "salloc --nodes=2" in problem.hint


def test_too_few_cpus_per_node_shows_the_arithmetic():
    # per_host tasks fork one process per device: a task needs devices CPUs
    (problem,) = allocation_problems(_plan("topology=2x4"),
                                     _allocation(SLURM_JOB_NUM_NODES="2", SLURM_JOB_CPUS_PER_NODE="2(x2)"))
    assert "has 2 CPU(s) (SLURM_JOB_CPUS_PER_NODE), host 0 of the spec needs 1 task(s) x 4 CPU(s) = 4" in problem.message
    uneven = _plan("topology=hetero_2_1", "launcher.tasks=per_device", "recipe.global_batch_size=60")
    (problem,) = allocation_problems(uneven, _allocation(SLURM_JOB_NUM_NODES="2", SLURM_JOB_CPUS_PER_NODE="1,1"))
    assert "host 0 of the spec needs 2 task(s) x 1 CPU(s) = 2" in problem.message


def test_named_hosts_the_allocation_lacks_are_named():
    named = _plan("topology=custom", "topology.hosts=[{name: n1, devices: 1}, {name: n2, devices: 1}]",
                  "recipe.global_batch_size=2")
    (problem,) = allocation_problems(named, _allocation(SLURM_JOB_NUM_NODES="2", SLURM_JOB_NODELIST="n[1,3]"))
    assert (problem.key, problem.message) == ("topology.hosts", "n2 not in the allocation (job 42)'s nodes (n[1,3])")
    assert allocation_problems(named, _allocation(SLURM_JOB_NUM_NODES="2", SLURM_JOB_NODELIST="n[1-2]")) == []


def test_the_job_and_its_options_are_checked_for_slurm():
    half_named = validate(["launcher=slurm", "device=cpu", "topology=custom",
                           "topology.hosts=[{name: n1, devices: 1}, {devices: 1}]", "recipe.global_batch_size=2"])
    assert half_named.find("topology.hosts", "name every host (they become --nodelist) or none")
    assert [p.key for p in job_problems(_plan("topology=2x2").job)] == []
    assert [p.key for p in spec_problems(_plan("topology=2x2").job.spec)] == []
