"""Regressions: bugs found in review, one small test each; each docstring says what went wrong."""

from __future__ import annotations

import pytest

from pathlib import Path


from conftest import TARGET, compose, environment, make_spec, validate
from runner.launchers import LAUNCHERS, Invocation
from runner.launchers import plan_for
from runner.plan.processes import Deferred
from runner.records.paths import RunPaths
from runner.spec.schema import BackendConfig, InitConfig, InitMethod

pytestmark = pytest.mark.unit

PATHS = RunPaths(Path("/runs/R1"), "R1")
INVOCATION = Invocation(python="/venv/bin/python", cwd="/work/proj")


def test_tcp_init_url_brackets_an_ipv6_master() -> None:
    """plan.py make_plan: ``f"tcp://{addr}:{port}"`` gives 'tcp://fd00::1:29500' for an IPv6 master,
    which urllib/torch cannot split into host and port. Expected: 'tcp://[fd00::1]:29500'.
    (launchers/mpi.py's ``-H fd00::1:2`` has the same ambiguity.)"""
    spec = make_spec(devices=[1, 1], names=["a", "b"], addrs=["fd00::1", "fd00::2"], launcher="manual",
                     init=InitConfig(method=InitMethod.tcp, master_port=29500))
    got = validate(spec)
    assert got.valid, got.rendered()
    assert plan_for(got.job).init_method == "tcp://[fd00::1]:29500"


def test_slurm_step_in_allocation_places_uneven_hosts() -> None:
    """launchers/slurm/launcher.py request(): inside an allocation (in_allocation=True) a 2+1 per_device job
    becomes ``srun ... --distribution=arbitrary`` with no SLURM_HOSTFILE: the hostfile that the batch
    script writes for the same layout is never written, and without it srun falls back to block
    placement, which need not be 2+1. Expected: the request writes/exports the hostfile as the
    batch script does (or sets --nodelist/--ntasks-per-node so the placement is the plan's)."""
    got = validate(compose(f"recipe.target={TARGET}", "topology=hetero_2_1", "launcher=slurm",
                           "launcher.tasks=per_device", "device=cpu", "recipe.global_batch_size=60"))
    plan = plan_for(got.job, PATHS)
    launcher = LAUNCHERS["slurm"](plan=plan, paths=PATHS, invocation=INVOCATION, environment=environment(SLURM_JOB_ID="42"))
    text = launcher.request().materialize()
    assert "--distribution=arbitrary" in text
    assert "SLURM_HOSTFILE" in text


def test_local_hosts_on_this_machine_order_does_not_matter() -> None:
    """validation.py: _check_master rejected host 0 'localhost' as a loopback master because host 1
    'thishost' (a name of this machine) is not *loopback*, calling it "another machine"; the reversed
    order was valid. Both are this machine, so both orders are valid (launcher=manual)."""
    def verdict(names):
        spec = make_spec(devices=[1, 1], names=names, launcher="manual")
        return validate(spec)

    a, b = verdict(["thishost", "localhost"]), verdict(["localhost", "thishost"])
    assert a.valid, a.rendered()
    assert b.valid, b.rendered()


def test_backend_env_cannot_contradict_the_plan() -> None:
    """plan.py Plan.host_env: ``env.update(job.spec.backend.env)`` comes after the runner's own
    variables, so backend.env={WORLD_SIZE: '99', MASTER_ADDR: x} silently replaces them (RANK and
    LOCAL_RANK are set later and survive): the process env then disagrees with its record and the
    plan. Validation now rejects backend.env keys the runner owns, each named."""
    spec = make_spec(nodes=1, devices_per_node=2, backend=BackendConfig(env={"WORLD_SIZE": "99", "MASTER_ADDR": "x"}))
    got = validate(spec)
    assert not got.valid
    for name in ("WORLD_SIZE", "MASTER_ADDR"):
        assert got.find(f"backend.env.{name}", "is set by the runner for every process from the plan"), got.rendered()


def test_plan_shows_the_port_the_manual_launch_pins() -> None:
    """plan.py make_plan + launchers/manual.py: with init.master_port=0 the plan (plan.json and the
    dry run's table) says MASTER_PORT='<free port chosen at launch>', but the manual (and mpi)
    launcher pins port_for(run_id) (e.g. 24429) into every host's command and spec.yaml. The plan
    then documents a different port from the one used. Expected: plan and pin agree."""
    spec = make_spec(devices=[2, 2], names=["a", "b"], launcher="manual")
    got = validate(spec)
    plan = plan_for(got.job, PATHS)
    pins = LAUNCHERS["manual"].pins(got.job, PATHS)
    assert plan.master_port == str(pins.master_port)


def test_slurm_named_hosts_are_the_allocated_ones() -> None:
    """launchers/slurm/launcher.py + validation.py _master_addr: with named hosts under launcher=slurm the
    batch script asks for any 2 nodes (no --nodelist), yet the plan pins MASTER_ADDR to host 0's
    name ('gpu01'): if Slurm allocates other nodes, every rank dials gpu01 and never rendezvous.
    Expected: pin the nodes (--nodelist=gpu01,gpu02), or leave MASTER_ADDR to the allocation, or
    reject/warn about host names under slurm."""
    spec = make_spec(devices=[2, 2], names=["gpu01", "gpu02"], launcher="slurm")
    got = validate(spec)
    assert got.valid, got.rendered()
    plan = plan_for(got.job, PATHS)
    script = LAUNCHERS["slurm"](plan=plan, paths=PATHS, invocation=INVOCATION, environment=environment()).request().files["job.sbatch"]
    assert "#SBATCH --nodelist=gpu01,gpu02" in script  # the named nodes are the ones Slurm gives
    assert plan.master_addr == Deferred.of("first host of SLURM_STEP_NODELIST")  # and the master is the step's first
    assert not any(p.key.startswith("topology.hosts") for p in got.problems)
