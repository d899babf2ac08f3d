"""launcher=slurm: a batch script submitted with sbatch, or an srun step inside an allocation."""

from __future__ import annotations

import shlex

from runner.launchers.base import HostCommand, Launcher, LaunchRequest
from runner.spec import DeviceKind, TaskMode


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

    def step_lines(self) -> list[str]:
        """The srun step, and for uneven hosts the hostfile that places its tasks 2+1 in rank order."""
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
        else:
            argv += [f"--ntasks-per-node={per_node}", "--distribution=block"]
        cpus = self._cpus_per_task()
        if cpus is not None:
            argv.append(f"--cpus-per-task={cpus}")
        lines.append(shlex.join([*argv, *self.task_argv()]))
        return lines

    def script(self) -> str:
        job, opts = self.plan.job, self.plan.job.spec.launcher.slurm
        _, per_node, _ = self._layout()
        q = shlex.quote
        lines = [
            "#!/bin/bash",
            f"# Written by `run` for run {self.paths.run_id}; submit with: sbatch {q(str(self.paths.sbatch_script))}",
            f"#SBATCH --job-name={q('run-' + self.paths.run_id)}",
            f"#SBATCH --nodes={len(job.hosts)}",
            f"#SBATCH --ntasks-per-node={per_node}",
            f"#SBATCH --time={opts.time}",
            f"#SBATCH --signal={opts.signal}",
            f"#SBATCH --output={q(str(self.paths.root / 'slurm-%j.out'))}",
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
        lines += ["", "set -euo pipefail", *self.step_lines()]
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
