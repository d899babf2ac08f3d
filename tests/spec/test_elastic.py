"""runner.spec.elastic: topology.min_nodes and topology.spares checked before anything starts (the launch that
survives a lost host: tests/launchers/elastic/, tests/e2e/test_lost_hosts.py, tests/e2e/test_lost_nodes_slurm.py)."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import make_spec, validate
from runner.launchers.base import AgentRuns
from runner.launchers.manual import ManualLauncher
from runner.launchers.mpi import MpiLauncher
from runner.spec.elastic import Elasticity, elasticity, world_size_range
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
    assert problem.message == f"launcher=mpi: {MpiLauncher.capabilities.lost_host_reason}"
    assert problem.hint.startswith("launcher=ssh")


def test_manual_goes_on_without_a_host_with_spares_too_and_its_keepalive_is_checked() -> None:
    """launcher=manual: each host's `run` runs its rounds (in its launch agent: the launch whole), a spare's stands by
    (runner.launchers.manual.rounds); a job that does not outlive its hosts hands the agent its share only."""
    got = validate(ssh_job([2, 2, 2], min_nodes=2, launcher="manual"))
    assert got.valid, got.rendered()
    assert ManualLauncher.capabilities.survives_lost_hosts and ManualLauncher.agent_runs(got.job) is AgentRuns.launch
    spared = validate(ssh_job([2, 2], spares=[HostConfig(name="h9", devices=2)], launcher="manual"))
    assert spared.valid and ManualLauncher.agent_runs(spared.job) is AgentRuns.launch, spared.rendered()
    assert ManualLauncher.agent_runs(validate(ssh_job([2, 2], launcher="manual")).job) is AgentRuns.share
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


def test_any_global_batch_of_a_sample_a_process_runs_at_every_world_size_the_job_can_shrink_to() -> None:
    """3 hosts of 2, at least 2 left: world sizes 6 and 4; 30 does not divide over 4 and needs not (it is split
    7, 7, 8, 8 ... exactly: runner.spec.batch). Only the full world size is checked: a batch smaller than it leaves a
    process without a sample."""
    got = validate(ssh_job([2, 2, 2], min_nodes=2, batch=30))
    assert got.valid, got.rendered()
    assert world_size_range(got.job, elasticity(got.job)) == (4, 6)
    small = validate(ssh_job([2, 2, 2], min_nodes=2, batch=5))
    problem = small.find("recipe.global_batch_size", "world size 6")
    assert problem is not None, small.rendered()
    assert problem.message == ("5 over world size 6 leaves rank 5 without a sample (5 < 6: each process takes at "
                               "least one of each global batch)")


def test_the_world_size_range_is_arithmetic_for_any_number_of_hosts() -> None:
    """No enumeration of the hosts a loss can leave (it stopped at 16 hosts before): 40 hosts of 8, at least 30."""
    got = validate(ssh_job([8] * 40, min_nodes=30, batch=1024))
    assert got.valid, got.rendered()
    assert world_size_range(got.job, elasticity(got.job)) == (240, 320)
    mixed = validate(ssh_job([4, 1, 2, 3], min_nodes=2, batch=64))
    assert world_size_range(mixed.job, elasticity(mixed.job)) == (3, 10)  # the 2 smallest hosts: 1 + 2


def test_spares_keep_the_world_size_and_need_the_hosts_devices() -> None:
    spare = HostConfig(name="s0")
    got = validate(ssh_job([2, 2, 2], spares=[spare]))
    assert got.valid, got.rendered()
    elastic = elasticity(got.job)
    assert [h.label for h in elastic.spares] == ["s0"] and elastic.spares[0].devices == 2
    assert world_size_range(got.job, elastic) == (6, 6)  # a spare fills the lost host's place
    small = validate(ssh_job([2, 2, 2], spares=[HostConfig(name="s0", devices=1)]))
    assert small.find("topology.spares[0].devices", "the hosts have 2") is not None


def test_a_spare_is_a_machine_of_its_own_with_a_name() -> None:
    assert validate(ssh_job([2, 2], spares=[HostConfig(name="h1")])).find("topology.spares[0]", "already one") \
        is not None
    assert validate(ssh_job([2, 2], spares=[HostConfig()])).find("topology.spares[0].name") is not None


def test_world_sizes_with_spares_fewer_than_the_losses() -> None:
    got = validate(ssh_job([1, 1, 1, 1], min_nodes=2, spares=[HostConfig(name="s0")], batch=12))
    assert got.valid, got.rendered()
    assert world_size_range(got.job, elasticity(got.job)) == (3, 4)  # one loss filled by the spare; two leave 3


def test_elasticity_is_off_for_a_job_of_every_host() -> None:
    assert not Elasticity(hosts=2, min_nodes=2, spares=()).enabled
    assert LauncherConfig().max_restarts == 0


def with_max_nodes(spec: JobConfig, max_nodes: int) -> JobConfig:
    return dataclasses.replace(spec, topology=dataclasses.replace(spec.topology, max_nodes=max_nodes))


def test_max_nodes_up_to_the_hosts_and_spares_is_taken_under_ssh() -> None:
    assert validate(with_max_nodes(ssh_job([2, 2, 2], min_nodes=2), 3)).valid
    spare = [HostConfig(name="h9", devices=2)]
    assert validate(with_max_nodes(ssh_job([2, 2], min_nodes=1, spares=spare), 3)).valid


@pytest.mark.parametrize("max_nodes", [1, 4])
def test_max_nodes_outside_the_hosts_and_spares_is_refused_with_the_arithmetic(max_nodes: int) -> None:
    got = validate(with_max_nodes(ssh_job([2, 2, 2], min_nodes=2), max_nodes))
    problem = got.find("topology.max_nodes", "must be 3..3 (the topology has 3 host(s))")
    assert problem is not None and f"got {max_nodes}" in problem.message and "spares" in problem.hint, got.rendered()


def test_max_nodes_is_refused_where_the_launcher_takes_no_host_back_with_its_reason() -> None:
    from runner.launchers import LAUNCHERS

    got = validate(with_max_nodes(ssh_job([2, 2, 2], min_nodes=2, launcher="slurm"), 3))
    problem = got.find("topology.max_nodes", "launcher=slurm: ")
    assert problem is not None, got.rendered()
    assert problem.message == f"launcher=slurm: {LAUNCHERS['slurm'].capabilities.hosts_back_reason}"
    assert problem.hint.startswith("launcher=ssh")


@pytest.mark.parametrize("launcher", ["ssh", "manual"])
def test_max_nodes_is_taken_where_the_launcher_takes_hosts_back(launcher: str) -> None:
    """ssh tries lost hosts again; under manual a lost host's `run` started again, or a spare, joins."""
    got = validate(with_max_nodes(ssh_job([2, 2, 2], min_nodes=2, launcher=launcher), 3))
    assert got.find("topology.max_nodes", "") is None, got.rendered()


def test_max_nodes_without_a_way_to_lose_a_host_is_refused() -> None:
    got = validate(with_max_nodes(ssh_job([2, 2, 2], max_restarts=0), 3))
    problem = got.find("topology.max_nodes", "without topology.min_nodes or topology.spares")
    assert problem is not None and "topology.min_nodes=2" in problem.hint, got.rendered()
