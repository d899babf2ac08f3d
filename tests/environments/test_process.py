"""runner.environments.process: what the runner reads of its own process's environment, once (patched
environments and cgroup files, no processes)."""

from __future__ import annotations

import pytest

from runner.environments import process
from runner.environments.process import ProcessEnvironment, _cgroup_cpu_quota

pytestmark = pytest.mark.unit


def test_its_own_variables_and_the_schedulers_are_read_into_one_object(monkeypatch) -> None:
    monkeypatch.setattr(process, "usable_cpus", lambda: 3)
    env = ProcessEnvironment.read({"OMP_NUM_THREADS": "4", "GLOO_SOCKET_IFNAME": "eth1", "NCCL_SOCKET_IFNAME": "",
                                   "TORCH_FR_BUFFER_SIZE": "200", "RUNNER_ATTEMPT": "2", "SLURM_JOB_ID": "9",
                                   "PMI_RANK": "1", "PMI_SIZE": "2", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
                                   "UNRELATED": "x"})
    assert (env.omp_num_threads, dict(env.socket_ifnames), env.cpu_count, env.flight_recorder, env.attempt,
            env.nccl_async_error_handling) == ("4", {"GLOO_SOCKET_IFNAME": "eth1"}, 3, "200", 2, "3")
    assert env.slurm.job_id == "9" and (env.mpi.rank, env.mpi.size) == (1, 2)
    bare = ProcessEnvironment.read({})
    assert (bare.omp_num_threads, dict(bare.socket_ifnames), bare.attempt, bare.mpi, bare.slurm.in_allocation) == \
        (None, {}, 0, None, False)


def test_usable_cpus_are_the_affinity_within_the_cgroups_quota(monkeypatch) -> None:
    monkeypatch.setattr(process.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(process, "_cgroup_cpu_quota", lambda: None)
    assert process.usable_cpus() == 4
    monkeypatch.setattr(process, "_cgroup_cpu_quota", lambda: 0.2)  # a fifth of a CPU: still one
    assert process.usable_cpus() == 1


def test_the_cgroup_cpu_quota_of_cgroup_v2_and_v1(tmp_path) -> None:
    own = tmp_path / "self_cgroup"
    (tmp_path / "fs" / "job7").mkdir(parents=True)
    (tmp_path / "fs" / "job7" / "cpu.max").write_text("150000 100000\n")
    own.write_text("0::/job7\n")
    assert _cgroup_cpu_quota(tmp_path / "fs", own) == 1.5
    (tmp_path / "fs" / "job7" / "cpu.max").write_text("max 100000\n")
    assert _cgroup_cpu_quota(tmp_path / "fs", own) is None
    (tmp_path / "fs" / "cpu" / "slurm").mkdir(parents=True)
    (tmp_path / "fs" / "cpu" / "slurm" / "cpu.cfs_quota_us").write_text("400000\n")
    (tmp_path / "fs" / "cpu" / "slurm" / "cpu.cfs_period_us").write_text("100000\n")
    own.write_text("4:memory:/x\n1:cpu,cpuacct:/slurm\n")
    assert _cgroup_cpu_quota(tmp_path / "fs", own) == 4.0
    own.write_text("")
    assert _cgroup_cpu_quota(tmp_path / "fs", own) is None
