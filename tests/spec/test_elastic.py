"""runner.spec.elastic: topology.min_nodes and topology.spares checked before anything starts (the launch that
survives a lost host: tests/launchers/elastic/, tests/e2e/test_lost_hosts.py, tests/e2e/test_lost_nodes_slurm.py)."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import make_spec, validate
from runner.launchers.manual import ManualLauncher
from runner.launchers.mpi import MpiLauncher
from runner.spec.elastic import Elasticity, elasticity, world_sizes
from runner.spec.schema import HostConfig, InitConfig, JobConfig, LauncherConfig, TaskMode, TopologyConfig

pytestmark = pytest.mark.unit


def ssh_job(devices: list[int], *, min_nodes: int | None = None, spares: list[HostConfig] | None = None,
            max_restarts: int = 3, batch: int | None = 48, launcher: str = "ssh", **kwargs: object) -> JobConfig:
    spec = make_spec(devices=devices, names=[f"h{i}" for i in range(len(devices))], launcher=launcher,
                     global_batch_size=batch, **kwargs)
    return dataclasses.replace(
        spec, topology=dataclasses.replace(spec.topology, min_nodes=min_nodes, spares=spares or []),
        launcher=dataclasses.replace(spec.launcher, max_restarts=max_restarts))


def test_without_min_nodes_or_spares_a_lost_host_ends_the_job_as_before() -> None:
    got = validate(ssh_job([2, 2, 2], max_restarts=0))
    assert got.valid, got.rendered()
    elastic = elasticity(got.job)
    assert (elastic.enabled, elastic.min_nodes, elastic.line()) == (
        False, 3, "a lost host ends the job (topology.min_nodes: every host)")


def test_min_nodes_below_the_hosts_lets_the_job_go_on_and_says_so() -> None:
    got = validate(ssh_job([2, 2, 2], min_nodes=2))
    assert got.valid, got.rendered()
    assert elasticity(got.job).line() == ("a lost host ends the attempt; the job restarts from the last checkpoint on "
                                          "the hosts that remain, while at least 2 of 3 do (topology.min_nodes)")


@pytest.mark.parametrize("min_nodes", [0, 4])
def test_min_nodes_outside_one_to_the_hosts_is_refused_with_the_count(min_nodes: int) -> None:
    got = validate(ssh_job([2, 2, 2], min_nodes=min_nodes))
    problem = got.find("topology.min_nodes", "must be 1..3")
    assert problem is not None and f"got {min_nodes}" in problem.message and "topology.min_nodes=2" in problem.hint


def test_mpi_cannot_go_on_without_a_host_and_refuses_with_its_reason() -> None:
    got = validate(ssh_job([2, 2, 2], min_nodes=2, launcher="mpi"))
    problem = got.find("topology.min_nodes", "mpirun ends every")
    assert problem is not None, got.rendered()
    assert problem.message == f"launcher=mpi: {MpiLauncher.lost_host_reason}"
    assert problem.hint.startswith("launcher=ssh")


def test_manual_goes_on_without_a_host_with_spares_too_and_its_keepalive_is_checked() -> None:
    """launcher=manual: each host's `run` runs its rounds, a spare's stands by (runner.launchers.manual.rounds)."""
    got = validate(ssh_job([2, 2, 2], min_nodes=2, launcher="manual"))
    assert got.valid, got.rendered()
    assert ManualLauncher.survives_lost_hosts and not ManualLauncher.hands_share_to_agent(got.job)
    spared = validate(ssh_job([2, 2], spares=[HostConfig(name="h9", devices=2)], launcher="manual"))
    assert spared.valid and not ManualLauncher.hands_share_to_agent(spared.job), spared.rendered()
    spec = ssh_job([2, 2, 2], min_nodes=2, launcher="manual")
    spec = dataclasses.replace(spec, launcher=dataclasses.replace(
        spec.launcher, manual=dataclasses.replace(spec.launcher.manual, keepalive_s=0)))
    problem = validate(spec).find("launcher.manual.keepalive_s", "must be 1 or more")
    assert problem is not None and "got 0" in problem.message and "keepalive_s=2" in problem.hint


def test_slurm_goes_on_without_a_node_with_one_task_a_node_and_named_hosts_beside_named_spares() -> None:
    """launcher=slurm runs a job that outlives its nodes (runner.launchers.slurm.rounds): restarts are its rounds."""
    assert not validate(ssh_job([2, 2, 2], min_nodes=2, launcher="slurm")).problems
    per_device = validate(dataclasses.replace(ssh_job([2, 2, 2], min_nodes=2, launcher="slurm"), launcher=LauncherConfig(
        kind="slurm", tasks=TaskMode.per_device, max_restarts=2)))
    problem = per_device.find("launcher.tasks", "per_device with topology.min_nodes")
    assert problem is not None and problem.hint == "launcher.tasks=per_host (the default)"
    spec = make_spec(devices=[2, 2], launcher="slurm")
    unnamed = dataclasses.replace(spec, topology=TopologyConfig(nodes=2, devices_per_node=2, spares=[HostConfig(name="d")]),
                                  launcher=dataclasses.replace(spec.launcher, max_restarts=1))
    assert validate(unnamed).find("topology.spares", "the hosts are not named") is not None
    no_restarts = dataclasses.replace(spec, launcher=dataclasses.replace(spec.launcher, max_restarts=1))
    assert validate(no_restarts).find("launcher.max_restarts", "launcher=slurm does not restart a job") is not None


def test_a_spare_on_the_local_launcher_is_refused() -> None:
    spec = make_spec(devices=[2], launcher="local")
    spec = dataclasses.replace(spec, topology=dataclasses.replace(spec.topology, spares=[HostConfig(name="d")]))
    assert validate(spec).find("topology.spares", "launcher=local: one machine") is not None


def test_a_lost_host_needs_a_restart_to_go_on() -> None:
    problem = validate(ssh_job([2, 2, 2], min_nodes=2, max_restarts=0)).find("launcher.max_restarts")
    assert problem is not None and "every change of its hosts counts as a restart" in problem.message


def test_a_fixed_master_cannot_follow_host_0() -> None:
    got = validate(ssh_job([2, 2, 2], min_nodes=2, init=InitConfig(master_addr="10.0.0.1")))
    problem = got.find("init.master_addr")
    assert problem is not None and "the next attempt's master is the next host 0" in problem.message


def test_the_global_batch_must_divide_over_every_world_size_the_job_can_shrink_to() -> None:
    """3 hosts of 2, at least 2 left: world sizes 6 and 4; 30 divides over 6 but not over 4."""
    got = validate(ssh_job([2, 2, 2], min_nodes=2, batch=30))
    problem = got.find("recipe.global_batch_size", "world size 4")
    assert problem is not None, got.rendered()
    assert problem.message == ("30 does not divide over world size 4, which the job runs at once hosts are lost "
                               "(topology.min_nodes=2: world sizes 6, 4): 30 / 4 = 7.50 per process (30 % 4 = 2); "
                               "the global batch is kept at every world size")
    assert problem.hint == "a global batch every one divides: recipe.global_batch_size=24"
    assert validate(ssh_job([2, 2, 2], min_nodes=2, batch=48)).valid


def test_spares_keep_the_world_size_and_need_the_hosts_devices() -> None:
    spare = HostConfig(name="s0")
    got = validate(ssh_job([2, 2, 2], spares=[spare]))
    assert got.valid, got.rendered()
    elastic = elasticity(got.job)
    assert [h.label for h in elastic.spares] == ["s0"] and elastic.spares[0].devices == 2
    assert world_sizes(got.job, elastic) == [6]  # a spare fills the lost host's place
    small = validate(ssh_job([2, 2, 2], spares=[HostConfig(name="s0", devices=1)]))
    assert small.find("topology.spares[0].devices", "the hosts have 2") is not None


def test_a_spare_is_a_machine_of_its_own_with_a_name() -> None:
    assert validate(ssh_job([2, 2], spares=[HostConfig(name="h1")])).find("topology.spares[0]", "already one") \
        is not None
    assert validate(ssh_job([2, 2], spares=[HostConfig()])).find("topology.spares[0].name") is not None


def test_world_sizes_with_spares_fewer_than_the_losses() -> None:
    got = validate(ssh_job([1, 1, 1, 1], min_nodes=2, spares=[HostConfig(name="s0")], batch=12))
    assert got.valid, got.rendered()
    assert world_sizes(got.job, elasticity(got.job)) == [4, 3]  # one loss filled by the spare; two leave 3


def test_elasticity_is_off_for_a_job_of_every_host() -> None:
    assert not Elasticity(hosts=2, min_nodes=2, spares=()).enabled
    assert LauncherConfig().max_restarts == 0
