"""launcher=slurm: a batch script submitted with sbatch, or an srun step inside an allocation."""

from __future__ import annotations

import shlex
import signal
from typing import TYPE_CHECKING

from runner.environments.slurm import SlurmEnvironment, expand_hostnames
from runner.launchers.base import HostCommand, Launcher, LaunchRequest, run_forwarding_signals
from runner.spec.problems import Problem, render_problems
from runner.spec.schema import DeviceKind, TaskMode
from runner.common.signals import stop_signal

if TYPE_CHECKING:
    from runner.launchers.slurm_array import ArrayMember


class SlurmLauncher(Launcher):
    name = "slurm"
    in_allocation = False  # set by the caller from SlurmEnvironment

    def _counts(self) -> list[int]:
        return [len(self.plan.host_records(h.index)) for h in self.plan.job.hosts]

    def _layout(self) -> tuple[int, int, bool]:
        """(ntasks, ntasks_per_node, arbitrary placement needed)."""
        job = self.plan.job
        if job.spec.launcher.tasks is TaskMode.per_host:
            return len(job.hosts), 1, False
        counts = self._counts()
        return sum(counts), max(counts), not job.uniform

    def _cpus_per_task(self) -> int | None:
        """Per-host tasks fork one process per device: give the task a CPU for each (Slurm's default is 1)."""
        opts = self.plan.job.spec.launcher
        if opts.slurm.cpus_per_task is not None:
            return opts.slurm.cpus_per_task
        return max(self._counts()) if opts.tasks is TaskMode.per_host else None

    def _nodelist(self) -> str | None:
        hosts = self.plan.job.hosts
        return ",".join(h.name for h in hosts) if all(h.name for h in hosts) else None

    def step_lines(self, background: bool = False) -> list[str]:
        """The srun step, and for uneven hosts the hostfile that places its tasks 2+1 in rank order;
        ``background``: started with ``&``, its pid in ``$step`` (the batch script forwards signals);
        else srun replaces the shell, so that signals to the step script reach srun."""
        ntasks, per_node, arbitrary = self._layout()
        job = self.plan.job
        lines = []
        argv = ["srun", "--kill-on-bad-exit=1", f"--nodes={len(job.hosts)}", f"--ntasks={ntasks}"]
        if arbitrary:
            hostfile = shlex.quote(str(self.paths.root / "hostfile.")) + "$SLURM_JOB_ID"
            lines += ["# uneven hosts: one hostfile line per task, in rank order, for --distribution=arbitrary",
                      f"export SLURM_HOSTFILE={hostfile}"]
            if self._nodelist():
                names = [h.name for h in job.hosts for _ in range(len(self.plan.host_records(h.index)))]
                lines.append(f'printf "%s\\n" {shlex.join(names)} > "$SLURM_HOSTFILE"')
            else:
                counts = " ".join(map(str, self._counts()))
                lines += [
                    'nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))',
                    f"counts=({counts})",
                    'for i in "${!counts[@]}"; do for ((j = 0; j < counts[i]; j++)); do echo "${nodes[i]}"; done; done'
                    ' > "$SLURM_HOSTFILE"',
                ]
            argv.append("--distribution=arbitrary")
            lines.append("unset SLURM_NTASKS_PER_NODE  # the allocation's count; the hostfile places this step's tasks")
        else:
            argv += [f"--ntasks-per-node={per_node}", "--distribution=block"]
        cpus = self._cpus_per_task()
        if cpus is not None:
            argv.append(f"--cpus-per-task={cpus}")
        command = shlex.join([*argv, *self.task_argv()])
        lines += [f"{command} &", "step=$!"] if background else [f"exec {command}"]
        return lines

    def script(self) -> str:
        job, opts = self.plan.job, self.plan.job.spec.launcher.slurm
        _, per_node, _ = self._layout()
        q = shlex.quote
        stop = stop_signal(opts.signal)
        lines = [
            "#!/bin/bash",
            f"# Written by `run` for run {self.paths.run_id}; submit with: sbatch {q(str(self.paths.sbatch_script))}",
            f"#SBATCH --job-name={q('run-' + self.paths.run_id)}",
            f"#SBATCH --nodes={len(job.hosts)}",
            f"#SBATCH --ntasks-per-node={per_node}",
            f"#SBATCH --time={opts.time}",
            f"#SBATCH --signal=B:{opts.signal.split(':')[-1]}",
            f"#SBATCH --output={q(str(self.paths.root / 'slurm-%j.out'))}",
            "#SBATCH --open-mode=append",
            "#SBATCH --requeue" if opts.requeue else "#SBATCH --no-requeue",
        ]
        if self._nodelist():
            lines.append(f"#SBATCH --nodelist={self._nodelist()}")
        if job.device is DeviceKind.cuda:
            gpus = max(h.devices for h in job.hosts)
            lines.append(f"#SBATCH --gpus-per-node={gpus}" if opts.gpu_request == "gpus-per-node"
                         else f"#SBATCH --gres=gpu:{gpus}")
        cpus = self._cpus_per_task()
        if cpus is not None:
            lines.append(f"#SBATCH --cpus-per-task={cpus}")
        for key in ("partition", "account", "qos", "mem"):
            value = getattr(opts, key)
            if value is not None:
                lines.append(f"#SBATCH --{key}={q(str(value))}")
        lines += [f"#SBATCH {q(x)}" for x in opts.extra]
        name = stop.name.removeprefix("SIG")
        then = ('requeue the job: it resumes from its checkpoint' if opts.requeue
                else 'end (launcher.slurm.requeue=true would requeue it)')
        lines += [
            "",
            "set -uo pipefail",
            f"# Slurm sends SIG{name} to this script before the time limit (--signal): the ranks are asked to",
            f"# checkpoint and return, then the script will {then}",
            "stop_requested=0",
            f'trap \'stop_requested=1; echo "run: SIG{name} from Slurm: asking the ranks to checkpoint and stop" >&2; '
            f'kill -{name} "$step" 2>/dev/null\' {name}',
            *self.step_lines(background=True),
            'while kill -0 "$step" 2>/dev/null; do wait "$step"; done',
            'wait "$step"; status=$?',
        ]
        if opts.requeue:
            lines += ['if [ "$stop_requested" = 1 ]; then',
                      '  echo "run: requeueing job $SLURM_JOB_ID; it resumes from its last checkpoint" >&2',
                      '  scontrol requeue "$SLURM_JOB_ID"',
                      "fi"]
        lines.append('exit "$status"')
        return "\n".join(lines) + "\n"

    def request(self) -> LaunchRequest:
        cwd = self.invocation.cwd
        if self.in_allocation:
            step = self.paths.root / "step.sh"
            text = "\n".join(["#!/bin/bash", f"# Written by `run` for run {self.paths.run_id}: an srun step",
                              "set -euo pipefail", *self.step_lines()]) + "\n"
            cmd = HostCommand("this allocation", ("bash", str(step)), "an srun step inside the current allocation", cwd=cwd)
            return LaunchRequest(self.name, (cmd,), files={step.name: text}, pins=self.pins())
        cmd = HostCommand("this machine (login node)", ("sbatch", "--parsable", str(self.paths.sbatch_script)),
                          "submits the batch script below", cwd=cwd)
        return LaunchRequest(self.name, (cmd,), files={self.paths.sbatch_script.name: self.script()}, pins=self.pins())

    # -- launch ---------------------------------------------------------------------------------------
    def allocation_problems(self, slurm: SlurmEnvironment) -> list[Problem]:
        """What the current allocation lacks for this job: nodes, CPUs per node, GPUs, named hosts."""
        job, problems = self.plan.job, []
        need = len(job.hosts)
        where = f"the allocation (job {slurm.job_id})"
        if slurm.num_nodes is not None and slurm.num_nodes < need:
            problems.append(Problem("topology", f"{where} has {slurm.num_nodes} node(s) (SLURM_JOB_NUM_NODES), "
                                    f"the spec needs {need} ({len(job.hosts)} host(s))",
                                    f"allocate {need}: salloc --nodes={need} ...; or leave the allocation and `run` "
                                    f"submits a batch job of the right size"))
        counts = self._counts()
        per_host = self.plan.job.spec.launcher.tasks is TaskMode.per_host
        cpus_each = self._cpus_per_task() or 1
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
        named = [h.name for h in job.hosts if h.name]
        if named and slurm.job_nodelist:
            try:
                allocated = set(expand_hostnames(slurm.job_nodelist))
            except RuntimeError:
                allocated = set(named)
            missing = [n for n in named if n not in allocated]
            if missing:
                problems.append(Problem("topology.hosts", f"{', '.join(missing)} not in {where}'s nodes "
                                        f"({slurm.job_nodelist})", "allocate those nodes (salloc --nodelist=...), "
                                        "or leave the host names out and let Slurm choose"))
        return problems

    def launch(self, request: LaunchRequest, recipe_cfg) -> int:
        import os
        import sys

        from runner.launchers import slurm_job

        slurm = SlurmEnvironment.read(os.environ)
        try:
            if self.in_allocation:
                problems = self.allocation_problems(slurm)
                if problems:
                    print(render_problems(problems), file=sys.stderr)
                    print("\nthe allocation does not fit the spec; nothing was started.", file=sys.stderr)
                    return 2
                step = request.commands[0]
                print(f"slurm: an srun step in job {slurm.job_id} ({self.paths.root / 'step.sh'})", file=sys.stderr)
                stop = stop_signal(self.plan.job.spec.launcher.slurm.signal)
                return run_forwarding_signals(list(step.argv), step.cwd, (signal.SIGINT, signal.SIGTERM, stop),
                                              self.rank_failed)
            job_id = slurm_job.submit(self.paths.sbatch_script, self.invocation.cwd)
        except slurm_job.SlurmError as e:
            print(f"error: launcher=slurm: {e}", file=sys.stderr)
            return 2
        (self.paths.root / "slurm_job_id").write_text(job_id + "\n")
        output = self.paths.root / f"slurm-{job_id}.out"
        print(f"slurm: submitted job {job_id}; output: {output}, rank logs: {self.paths.logs}/", file=sys.stderr)
        if not self.plan.job.spec.launcher.slurm.follow:
            print(f"slurm: not following it (launcher.slurm.follow=false): `squeue -j {job_id}` shows it", file=sys.stderr)
            return 0
        return slurm_job.follow(job_id, output, outcome=self._outcome, rank_failed=self.rank_failed)

    def array_member(self) -> ArrayMember:
        """This job as a member of a sweep's job array (runner.launchers.slurm_array): its batch script
        is written, the array's script runs it."""
        from runner.launchers.slurm_array import ArrayMember

        own = ("#SBATCH --job-name=", "#SBATCH --output=", "#SBATCH --open-mode=")
        directives = tuple(line for line in self.script().splitlines()
                           if line.startswith("#SBATCH ") and not line.startswith(own))
        records, opts = self.plan.records, self.plan.job.spec.launcher.slurm
        return ArrayMember(self.paths.root, self.paths.sbatch_script, directives, self.invocation.cwd,
                           tuple(self.paths.done_file(r.global_rank) for r in records),
                           tuple(self.paths.error_file(r.global_rank) for r in records),
                           opts.array_parallelism, opts.follow)

    def _outcome(self) -> int:
        """0 when every rank of the run left its done file, else 1 (for a job Slurm forgot already)."""
        done = all(self.paths.done_file(r.global_rank).exists() for r in self.plan.records)
        return 0 if done else 1
