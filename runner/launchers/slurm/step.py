"""The job's srun step as a request: :func:`srun_step` reads the plan once into an :class:`SrunStep`, whose lines are
then plain text — in the batch script (runner.launchers.slurm.sbatch), or, inside an allocation, in a step script of
their own (:meth:`SrunStep.materialize`). A job that outlives its nodes runs no srun line here: its step is the `run`
that holds its srun steps, one a round (runner.app.slurm_rounds), which the dry run narrates (:func:`rounds_said`)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from runner.launchers.base import HostCommand
from runner.plan.processes import Plan
from runner.records.paths import RunPaths
from runner.spec.elastic import declares_elasticity, elasticity
from runner.spec.job import Job
from runner.spec.schema import TaskMode


@dataclass(frozen=True, slots=True, kw_only=True)
class Hostfile:
    """Uneven hosts: the file that places the step's tasks in rank order, one line per task, for
    ``--distribution=arbitrary`` (2+1 where Slurm alone would place 2+2)."""

    path: str  # as the batch script names it: quoted, then $SLURM_JOB_ID
    names: tuple[str, ...] | None  # each task's node, in rank order, where the hosts are named; None: Slurm names them
    counts: tuple[int, ...]  # tasks per node, in host order (for the nodes Slurm names)

    def lines(self) -> list[str]:
        lines = ["# uneven hosts: one hostfile line per task, in rank order, for --distribution=arbitrary",
                 f"export SLURM_HOSTFILE={self.path}"]
        if self.names is not None:
            lines.append(f'printf "%s\\n" {shlex.join(self.names)} > "$SLURM_HOSTFILE"')
        else:
            lines += [
                'nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))',
                f"counts=({' '.join(map(str, self.counts))})",
                'for i in "${!counts[@]}"; do for ((j = 0; j < counts[i]; j++)); do echo "${nodes[i]}"; done; done'
                ' > "$SLURM_HOSTFILE"',
            ]
        return lines


@dataclass(frozen=True, slots=True, kw_only=True)
class SrunStep:
    """Everything the job's step says: the srun line that starts its tasks (and the hostfile of uneven hosts), or,
    for a job that outlives its nodes, the `run` that holds its srun steps instead (``holding_run``)."""

    run_id: str
    task: tuple[str, ...]  # what each task runs (`python -P -m runner.app.task <spec>`: Launcher.task_argv)
    holding_run: tuple[str, ...] | None  # a job that outlives its nodes: `python -P -m runner.app.slurm_rounds <spec>`
    nodes: int  # --nodes: the hosts (the spares wait outside the step)
    ntasks: int
    tasks_per_node: int  # --ntasks-per-node where the tasks are placed evenly (and the batch script's)
    cpus_per_task: int | None  # None: Slurm's default
    hostfile: Hostfile | None  # uneven hosts: the tasks placed by a hostfile

    def lines(self, background: bool = False) -> list[str]:
        """The step's lines. ``background``: started with ``&``, its pid in ``$step`` (the batch script forwards
        signals); else ``exec``: srun replaces the shell, so that signals to the step script reach srun."""
        if self.holding_run is not None:
            note = "# the job outlives its nodes: this `run` holds its srun steps, one a round on the nodes that remain"
            return [note, *_started(shlex.join(self.holding_run), background)]
        lines = []
        argv = ["srun", "--kill-on-bad-exit=1", f"--nodes={self.nodes}", f"--ntasks={self.ntasks}"]
        if self.hostfile is not None:
            lines += self.hostfile.lines()
            argv.append("--distribution=arbitrary")
            lines.append("unset SLURM_NTASKS_PER_NODE  # the allocation's count; the hostfile places this step's tasks")
        else:
            argv += [f"--ntasks-per-node={self.tasks_per_node}", "--distribution=block"]
        if self.cpus_per_task is not None:
            argv.append(f"--cpus-per-task={self.cpus_per_task}")
        return [*lines, *_started(shlex.join([*argv, *self.task]), background)]

    def materialize(self) -> str:
        """The step script `run` runs inside an allocation (salloc, a batch job): the step, exec'd."""
        return "\n".join(["#!/bin/bash", f"# Written by `run` for run {self.run_id}: an srun step", "set -euo pipefail",
                          *self.lines()]) + "\n"


def _started(command: str, background: bool) -> list[str]:
    return [f"{command} &", "step=$!"] if background else [f"exec {command}"]


def cpus_per_task(plan: Plan) -> int | None:
    """Per-host tasks fork one process per device: give the task a CPU for each (Slurm's default is 1)."""
    opts = plan.job.spec.launcher
    if opts.slurm.cpus_per_task is not None:
        return opts.slurm.cpus_per_task
    return max(plan.processes_per_host) if opts.tasks is TaskMode.per_host else None


def srun_step(plan: Plan, paths: RunPaths, python: str, task: tuple[str, ...]) -> SrunStep:
    """The plan's step: one task per host (per_host), or one per process, placed by a hostfile on uneven hosts; for a
    job that outlives its nodes, the `run` (``python``) that holds its steps."""
    job, counts = plan.job, plan.processes_per_host
    holding_run = (python, "-P", "-m", "runner.app.slurm_rounds", str(paths.spec)) \
        if declares_elasticity(job.spec) else None
    if job.spec.launcher.tasks is TaskMode.per_host:
        ntasks, per_node, hostfile = len(job.hosts), 1, None
    else:
        ntasks, per_node, hostfile = sum(counts), max(counts), None
        if not job.uniform:
            named = all(h.name for h in job.hosts)
            names = tuple(h.name for h, n in zip(job.hosts, counts) for _ in range(n)) if named else None
            hostfile = Hostfile(path=paths.hostfile_in_batch_script(), names=names, counts=counts)
    return SrunStep(run_id=paths.run_id, task=task, holding_run=holding_run, nodes=len(job.hosts), ntasks=ntasks,
                    tasks_per_node=per_node, cpus_per_task=cpus_per_task(plan), hostfile=hostfile)


def rounds_said(job: Job) -> tuple[HostCommand, ...]:
    """What the dry run says of a job that outlives its nodes: how it goes on, and how a lost node is found."""
    if not declares_elasticity(job.spec):
        return ()
    every = job.spec.launcher.slurm.keepalive_s
    spares = ", ".join(h.label for h in job.spares)
    spared = f"; spare node(s) {spares} idle in the allocation until one takes a place" if spares else ""
    return (HostCommand(host=elasticity(job).line(), argv=None),
            HostCommand(host=f"each round an srun step on the nodes that remain (runner.app.slurm_rounds); a node is "
                             f"lost when its task is silent for {4 * every} s (launcher.slurm.keepalive_s={every}) "
                             f"or Slurm takes it out of the job{spared}", argv=None))
