"""runner.environments.process and child: the runner's own environment, read once; a child's, built once."""

from __future__ import annotations

import pytest

from conftest import validate
from runner.environments.child import child_environment
from runner.environments.process import ProcessEnvironment
from runner.launchers import plan_for
from runner.records.paths import RunPaths

pytestmark = pytest.mark.unit


def test_what_the_runner_reads_of_its_own_process() -> None:
    env = ProcessEnvironment.read({"OMP_NUM_THREADS": "3", "GLOO_SOCKET_IFNAME": "eth1", "SLURM_JOB_ID": "7",
                                   "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "HOME": "/root"})
    assert env.omp_num_threads == "3" and dict(env.socket_ifnames) == {"GLOO_SOCKET_IFNAME": "eth1"}
    assert env.slurm.in_allocation and env.mpi is not None and env.mpi.rank == 1
    empty = ProcessEnvironment.read({})
    assert empty.omp_num_threads is None and not empty.slurm.in_allocation and empty.mpi is None


def _plan(tmp_path, *overrides: str):
    got = validate(("device=cpu", *overrides))
    assert got.valid, got.rendered()
    paths = RunPaths(tmp_path, "run7", attempt=2)
    return plan_for(got.job, paths), paths


def test_a_childs_environment(tmp_path) -> None:
    plan, paths = _plan(tmp_path, "topology=1x4")
    parent = ProcessEnvironment.read({})
    parent = ProcessEnvironment(slurm=parent.slurm, mpi=parent.mpi, omp_num_threads=None, socket_ifnames={}, cpu_count=8)
    env = child_environment(plan, plan.records[3], paths, parent, master_port="29511", agent_store=True,
                            network={"GLOO_SOCKET_IFNAME": "lan0"}, tmpdir=str(tmp_path / "tmp"))
    assert env == {
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511", "WORLD_SIZE": "4", "GROUP_RANK": "0", "NODE_RANK": "0",
        "GROUP_WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "4", "ROLE_WORLD_SIZE": "4", "ROLE_NAME": "default", "RANK": "3",
        "LOCAL_RANK": "3", "ROLE_RANK": "3", "TORCHELASTIC_RUN_ID": "run7", "TORCHELASTIC_RESTART_COUNT": "2",
        "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_ERROR_FILE": str(paths.rank(3).elastic_error),
        "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "GLOO_SOCKET_IFNAME": "lan0",
        "OMP_NUM_THREADS": "2", "TORCH_FR_BUFFER_SIZE": "200", "TMPDIR": str(tmp_path / "tmp"),
    }


def test_torchruns_group_world_size_and_max_restarts_and_the_users_nccl_setting(tmp_path) -> None:
    """GROUP_WORLD_SIZE is the number of hosts; TORCHELASTIC_MAX_RESTARTS is launcher.max_restarts (torchrun's
    --max-restarts); TORCH_NCCL_ASYNC_ERROR_HANDLING is 1 unless the user set it (then inherited as it is)."""
    plan, paths = _plan(tmp_path, "topology=2x3", "launcher=manual", "launcher.max_restarts=2", "init=tcp",
                        "topology.hosts=[{name: a}, {name: b}]", "topology.nodes=null", "topology.devices_per_node=3",
                        "recipe.global_batch_size=60")
    env = child_environment(plan, plan.records[4], paths, ProcessEnvironment.read({}), master_port="1",
                            agent_store=False)
    assert (env["GROUP_WORLD_SIZE"], env["GROUP_RANK"], env["TORCHELASTIC_MAX_RESTARTS"]) == ("2", "1", "2")
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    users = ProcessEnvironment.read({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"})
    env = child_environment(plan, plan.records[4], paths, users, master_port="1", agent_store=False)
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in env  # the user's own, inherited, wins


def test_threads_are_a_share_of_the_cpus_this_process_may_use(tmp_path, monkeypatch) -> None:
    """OMP_NUM_THREADS follows the affinity mask (taskset, a Slurm task's CPUs) and the cgroup's CPU quota, not
    the machine's CPU count."""
    import runner.environments.process as process

    monkeypatch.setattr(process.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5})
    monkeypatch.setattr(process, "_cgroup_cpu_quota", lambda: None)
    assert process.usable_cpus() == 6
    monkeypatch.setattr(process, "_cgroup_cpu_quota", lambda: 2.5)  # a container's --cpus=2.5
    assert process.usable_cpus() == 3
    plan, paths = _plan(tmp_path, "topology=1x2")
    env = child_environment(plan, plan.records[0], paths, ProcessEnvironment.read({}), master_port="1",
                            agent_store=False)
    assert env["OMP_NUM_THREADS"] == "1"  # 3 usable CPUs over 2 processes


def test_the_users_threads_win_and_no_agent_store_for_a_task(tmp_path) -> None:
    plan, paths = _plan(tmp_path, "topology=1x2")
    parent = ProcessEnvironment.read({"OMP_NUM_THREADS": "5"})
    env = child_environment(plan, plan.records[0], paths, parent, master_port="1", agent_store=False)
    assert env["OMP_NUM_THREADS"] == "5" and "TORCHELASTIC_USE_AGENT_STORE" not in env


def test_the_flight_recorder_follows_log_collectives_unless_the_user_sized_it(tmp_path) -> None:
    plan, paths = _plan(tmp_path, "topology=1x2", "log.collectives=0")
    env = child_environment(plan, plan.records[0], paths, ProcessEnvironment.read({}), master_port="1", agent_store=False)
    assert "TORCH_FR_BUFFER_SIZE" not in env
    plan, paths = _plan(tmp_path, "topology=1x2")
    users = ProcessEnvironment.read({"TORCH_FR_BUFFER_SIZE": "5000"})
    env = child_environment(plan, plan.records[0], paths, users, master_port="1", agent_store=False)
    assert "TORCH_FR_BUFFER_SIZE" not in env  # the user's own, inherited, wins
