"""launcher=slurm's rules: its options (:func:`spec_problems`), whether the resolved job fits Slurm
(:func:`job_problems`, a job that outlives its nodes included), and, when `run` runs inside an allocation, whether
the allocation fits the job (:func:`allocation_problems`). SlurmLauncher answers validation with the first two."""

from __future__ import annotations

import re
from collections.abc import Iterator

from runner.environments.slurm import SlurmEnvironment, expand_hostnames
from runner.launchers.slurm.sbatch import job_nodes
from runner.launchers.slurm.step import cpus_per_task
from runner.plan.processes import Plan
from runner.spec.elastic import declares_elasticity
from runner.spec.job import Job
from runner.spec.problems import Problem, Severity
from runner.spec.schema import DeviceKind, JobConfig, TaskMode

_SLURM_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")
_SLURM_SIGNAL = re.compile(r"^(R:|B:)?(SIG)?[A-Z0-9]+(@\d+)?$")


def spec_problems(spec: JobConfig) -> Iterator[Problem]:
    """launcher.slurm's options, each as sbatch would take it."""
    slurm = spec.launcher.slurm
    if not _SLURM_TIME.match(slurm.time):
        yield Problem("launcher.slurm.time", f"{slurm.time!r} is not a Slurm time",
                      "use minutes, MM:SS, HH:MM:SS or D-HH:MM:SS, e.g. 04:00:00")
    if not _SLURM_SIGNAL.match(slurm.signal):
        yield Problem("launcher.slurm.signal", f"{slurm.signal!r} is not a Slurm --signal value",
                      "SIGNAL@SECONDS before the time limit, e.g. USR1@90")
    if slurm.gpu_request not in ("gpus-per-node", "gres"):
        yield Problem("launcher.slurm.gpu_request", f"{slurm.gpu_request!r} is not one of gpus-per-node, gres",
                      "gpus-per-node (#SBATCH --gpus-per-node=N) or gres (#SBATCH --gres=gpu:N)")
    if slurm.cpus_per_task is not None and slurm.cpus_per_task < 1:
        yield Problem("launcher.slurm.cpus_per_task", f"must be at least 1, got {slurm.cpus_per_task}",
                      "leave it null for Slurm's default")
    if slurm.array_parallelism is not None and slurm.array_parallelism < 1:
        yield Problem("launcher.slurm.array_parallelism", f"must be at least 1, got {slurm.array_parallelism}",
                      "leave it null to let Slurm run every job of a sweep's array at once")
    for i, line in enumerate(slurm.extra):
        if not line.startswith("--") or "\n" in line:
            yield Problem(f"launcher.slurm.extra[{i}]", f"{line!r} is not an sbatch option",
                          "one long option per entry, e.g. --constraint=a100")


def job_problems(job: Job) -> Iterator[Problem]:
    """Whether the resolved hosts and devices fit a Slurm job (every node asks the same resources)."""
    spec, hosts = job.spec, job.hosts
    if spec.device is DeviceKind.auto and job.device is DeviceKind.cpu:
        yield Problem("device", "auto: this machine has no CUDA GPU, so the job asks Slurm for CPU processes",
                      "on a login node without GPUs, say device=cuda to get GPU nodes", Severity.notice)
    if not job.uniform and spec.launcher.tasks is TaskMode.per_host:
        counts = "+".join(str(h.devices) for h in hosts)
        yield Problem("launcher.tasks",
                      f"per_host starts one task per node that spawns the same number of processes on every node, "
                      f"but the hosts have {counts} devices (Slurm asks the same resources of every node of a job)",
                      "launcher.tasks=per_device (one Slurm task per process, placed 2+1 by the runner); "
                      "launcher=manual or mpi can also spawn per host")
    if 0 < sum(h.name is not None for h in hosts) < len(hosts):
        yield Problem("topology.hosts", "under Slurm, name every host (they become --nodelist) or none (Slurm picks)",
                      "give each host a name, or drop the names")
    yield from _elastic_problems(job)


def _elastic_problems(job: Job) -> Iterator[Problem]:
    """A job that outlives its nodes: one task per node (it restarts its share, and says it is there), and named
    hosts beside named spares (both are nodes of the allocation, --nodelist)."""
    if not declares_elasticity(job.spec):
        return
    if job.spec.launcher.tasks is not TaskMode.per_host:
        yield Problem("launcher.tasks", "per_device with topology.min_nodes or topology.spares: each round of a job "
                      "that outlives its nodes runs one task per node, which restarts its node's share",
                      "launcher.tasks=per_host (the default)")
    if job.spares and not all(h.name for h in job.hosts):
        yield Problem("topology.spares", "spares are nodes of the allocation by name (--nodelist), and the hosts "
                      "are not named: Slurm could give a host the spare's node",
                      "name the hosts too: 'topology.hosts=[{name: n1}, {name: n2}]'")


def allocation_problems(plan: Plan, slurm: SlurmEnvironment) -> list[Problem]:
    """What the current allocation lacks for ``plan``'s job: nodes, CPUs per node, GPUs, named hosts."""
    job, where = plan.job, f"the allocation (job {slurm.job_id})"
    need, counts = job_nodes(job), plan.processes_per_host
    problems = []
    if slurm.num_nodes is not None and slurm.num_nodes < need:
        problems.append(Problem("topology", f"{where} has {slurm.num_nodes} node(s) (SLURM_JOB_NUM_NODES), "
                                f"the spec needs {need} ({len(job.hosts)} host(s))",
                                f"allocate {need}: salloc --nodes={need} ...; or leave the allocation and `run` "
                                f"submits a batch job of the right size"))
    per_host = job.spec.launcher.tasks is TaskMode.per_host
    cpus_each = cpus_per_task(plan) or 1
    have = slurm.cpus_per_node or ()
    for i, host in enumerate(job.hosts[:len(have)]):
        tasks = 1 if per_host else counts[i]
        if tasks * cpus_each > have[i]:
            problems.append(Problem("topology", f"node {i} of {where} has {have[i]} CPU(s) (SLURM_JOB_CPUS_PER_NODE), "
                                    f"host {i} of the spec needs {tasks} task(s) x {cpus_each} CPU(s) = "
                                    f"{tasks * cpus_each}", f"allocate more: salloc --nodes={need} "
                                    f"--ntasks-per-node={max(counts) if not per_host else 1} --cpus-per-task={cpus_each}"))
            break
    if job.device is DeviceKind.cuda and slurm.gpus_on_node is not None and slurm.gpus_on_node < max(counts):
        problems.append(Problem("topology", f"{where} has {slurm.gpus_on_node} GPU(s) on this node "
                                f"(SLURM_GPUS_ON_NODE), the spec needs {max(counts)} per host",
                                f"allocate them: salloc --gpus-per-node={max(counts)} ..."))
    return problems + _missing_nodes(job, slurm, where)


def _missing_nodes(job: Job, slurm: SlurmEnvironment, where: str) -> list[Problem]:
    """Named hosts that are not nodes of the allocation."""
    named = [h.name for h in job.hosts if h.name]
    if not named or not slurm.job_nodelist:
        return []
    try:
        allocated = set(expand_hostnames(slurm.job_nodelist))
    except ValueError:
        allocated = set(named)
    missing = [n for n in named if n not in allocated]
    if not missing:
        return []
    return [Problem("topology.hosts", f"{', '.join(missing)} not in {where}'s nodes ({slurm.job_nodelist})",
                    "allocate those nodes (salloc --nodelist=...), or leave the host names out and let Slurm choose")]
