"""The job's batch script as a request: :func:`sbatch_request` reads the plan and the run's paths once into an
:class:`SbatchRequest`, everything the script says, and :meth:`SbatchRequest.materialize` gives its text, which `run`
writes into the run folder and submits, and the dry run prints (tests/golden/slurm_*.txt).

The script asks for the job's nodes (hosts and spares), starts the step (runner.launchers.slurm.step) in the
background, and traps the stop signal: Slurm sends it before the time limit (``--signal=B:...``) and `run` passes it
on when it is sent it; the script forwards it to the step, whose ranks checkpoint and return, then requeues the job
(launcher.slurm.requeue) unless `run` wrote its user-stop marker first."""

from __future__ import annotations

import shlex
import signal
from dataclasses import dataclass
from pathlib import Path

from runner.launchers.slurm.step import SrunStep, cpus_per_task, srun_step
from runner.plan.processes import Plan
from runner.records.paths import RunPaths
from runner.spec.elastic import declares_elasticity
from runner.spec.job import Job
from runner.spec.schema import DeviceKind

_OPTIONS = ("partition", "account", "qos", "mem")  # launcher.slurm's keys that are sbatch options of their name


@dataclass(frozen=True, slots=True, kw_only=True)
class SbatchRequest:
    """Everything the job's batch script says; :meth:`materialize` is plain text from it."""

    run_id: str
    script: Path  # where the script is written (its header says how to submit it)
    output: Path  # --output, with Slurm's %j for the job id
    user_stop: Path  # the marker `run` writes when the user asks it to stop: the script then ends, not requeues
    nodes: int  # the hosts, and the spares kept ready
    tasks_per_node: int
    time: str  # launcher.slurm.time
    signal: str  # launcher.slurm.signal, as the spec gives it (SIGNAL@SECONDS, perhaps with R: or B:)
    stop_signal: signal.Signals  # the plan's stop signal, which the script traps and forwards to the step
    requeue: bool  # requeued after Slurm's stop signal (launcher.slurm.requeue)
    no_kill: bool  # a job that outlives its nodes: a lost node leaves the allocation to the others
    nodelist: str | None  # the hosts' and spares' names; None: Slurm picks the nodes
    gpus: str | None  # the GPU directive (gpus-per-node=N or gres=gpu:N); None: CPU processes
    cpus_per_task: int | None  # None: Slurm's default
    options: tuple[tuple[str, str], ...]  # partition, account, qos, mem: those set
    extra: tuple[str, ...]  # launcher.slurm.extra, one sbatch option each
    step: SrunStep

    def directives(self) -> list[str]:
        """The script's ``#SBATCH`` lines (a sweep's array takes the job's own: runner.launchers.slurm.array)."""
        q = shlex.quote
        lines = [
            f"#SBATCH --job-name={q('run-' + self.run_id)}",
            f"#SBATCH --nodes={self.nodes}",
            f"#SBATCH --ntasks-per-node={self.tasks_per_node}",
            f"#SBATCH --time={self.time}",
            f"#SBATCH --signal=B:{self.signal.split(':')[-1]}",
            f"#SBATCH --output={q(str(self.output))}",
            "#SBATCH --open-mode=append",
            "#SBATCH --requeue" if self.requeue else "#SBATCH --no-requeue",
        ]
        if self.no_kill:
            lines.append("#SBATCH --no-kill")
        if self.nodelist:
            lines.append(f"#SBATCH --nodelist={self.nodelist}")
        if self.gpus is not None:
            lines.append(f"#SBATCH --{self.gpus}")
        if self.cpus_per_task is not None:
            lines.append(f"#SBATCH --cpus-per-task={self.cpus_per_task}")
        lines += [f"#SBATCH --{key}={q(value)}" for key, value in self.options]
        return lines + [f"#SBATCH {q(x)}" for x in self.extra]

    def materialize(self) -> str:
        """The batch script: its directives, the stop signal's trap, the step, then the requeue and the exit."""
        lines = ["#!/bin/bash",
                 f"# Written by `run` for run {self.run_id}; submit with: sbatch {shlex.quote(str(self.script))}",
                 *self.directives(), "", *self._trapped_step()]
        return "\n".join([*lines, *self._requeue(), 'exit "$status"']) + "\n"

    def _trapped_step(self) -> list[str]:
        name, marker = self.stop_signal.name.removeprefix("SIG"), self.user_stop.name
        then = ([f"# requeue the job, which resumes from its checkpoint; unless `run` wrote {marker} first (the user",
                 "# asked it to stop): then the job ends"] if self.requeue
                else ["# end (launcher.slurm.requeue=true would requeue it after Slurm's time-limit signal)"])
        return [
            "set -uo pipefail",
            f"# SIG{name} asks the ranks to checkpoint and return: Slurm sends it to this script before the time limit",
            f"# (--signal), and `run` passes it on when it is sent it (kill -{name} <pid of run>); then the script will",
            *then,
            "stop_requested=0",
            f'trap \'stop_requested=1; echo "run: SIG{name} from Slurm: asking the ranks to checkpoint and stop" >&2; '
            f'kill -{name} "$step" 2>/dev/null\' {name}',
            *self.step.lines(background=True),
            'while kill -0 "$step" 2>/dev/null; do wait "$step"; done',
            'wait "$step"; status=$?',
        ]

    def _requeue(self) -> list[str]:
        if not self.requeue:
            return []
        return [f'if [ "$stop_requested" = 1 ] && [ -e {shlex.quote(str(self.user_stop))} ]; then',
                f'  echo "run: stopped at the user\'s request ({self.user_stop.name}): job $SLURM_JOB_ID ends, not '
                f'requeued" >&2',
                'elif [ "$stop_requested" = 1 ]; then',
                '  echo "run: requeueing job $SLURM_JOB_ID; it resumes from its last checkpoint" >&2',
                '  scontrol requeue "$SLURM_JOB_ID"',
                "fi"]


def job_nodes(job: Job) -> int:
    """Nodes the job asks for: its hosts, and the spares kept ready."""
    return len(job.hosts) + len(job.spares)


def _nodelist(job: Job) -> str | None:
    """The hosts' (and spares') names for --nodelist; None where Slurm picks."""
    return ",".join(h.name for h in (*job.hosts, *job.spares)) if all(h.name for h in job.hosts) else None


def _gpus(job: Job) -> str | None:
    if job.device is not DeviceKind.cuda:
        return None
    gpus = max(h.devices for h in job.hosts)
    return f"gpus-per-node={gpus}" if job.spec.launcher.slurm.gpu_request == "gpus-per-node" else f"gres=gpu:{gpus}"


def sbatch_request(plan: Plan, paths: RunPaths, python: str, task: tuple[str, ...]) -> SbatchRequest:
    """The batch script of ``plan``'s job, written at ``paths.sbatch_script``; ``python`` and ``task``: the step's
    (runner.launchers.slurm.step.srun_step)."""
    job, opts = plan.job, plan.job.spec.launcher.slurm
    step = srun_step(plan, paths, python, task)
    options = tuple((key, str(value)) for key in _OPTIONS if (value := getattr(opts, key)) is not None)
    return SbatchRequest(run_id=paths.run_id, script=paths.sbatch_script, output=paths.slurm_output("%j"),
                         user_stop=paths.user_stop, nodes=job_nodes(job), tasks_per_node=step.tasks_per_node,
                         time=opts.time, signal=opts.signal, stop_signal=plan.rules.stop_signal, requeue=opts.requeue,
                         no_kill=declares_elasticity(job.spec), nodelist=_nodelist(job), gpus=_gpus(job),
                         cpus_per_task=cpus_per_task(plan), options=options, extra=tuple(opts.extra), step=step)
