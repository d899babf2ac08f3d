"""launcher=slurm: a batch script submitted with sbatch, or an srun step inside an allocation."""

from __future__ import annotations

import shlex

from runner.launchers.base import HostCommand, Launcher, LaunchRequest
from runner.spec import DeviceKind, TaskMode

PORT_EXPR = "$((20000 + SLURM_JOB_ID % 10000))"


class SlurmLauncher(Launcher):
    name = "slurm"
    in_allocation = False  # set by the caller from SlurmEnvironment

    def _layout(self) -> tuple[int, int, bool]:
        """(ntasks, ntasks_per_node, arbitrary placement needed)."""
        job = self.plan.job
        if job.spec.launcher.tasks is TaskMode.per_host:
            return len(job.hosts), 1, False
        counts = [len(self.plan.host_records(h.index)) for h in job.hosts]
        return sum(counts), max(counts), not job.uniform

    def srun_argv(self) -> tuple[str, ...]:
        ntasks, per_node, arbitrary = self._layout()
        argv = ["srun", "--kill-on-bad-exit=1", f"--nodes={len(self.plan.job.hosts)}", f"--ntasks={ntasks}"]
        argv += ["--distribution=arbitrary"] if arbitrary else [f"--ntasks-per-node={per_node}", "--distribution=block"]
        return (*argv, *self.task_argv())

    def script(self) -> str:
        job, opts = self.plan.job, self.plan.job.spec.launcher.slurm
        ntasks, per_node, arbitrary = self._layout()
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
        if job.device is DeviceKind.cuda:
            gpus = max(h.devices for h in job.hosts)
            lines.append(f"#SBATCH --gpus-per-node={gpus}" if opts.gpu_request == "gpus-per-node"
                         else f"#SBATCH --gres=gpu:{gpus}")
        for key in ("partition", "account", "qos", "cpus_per_task", "mem"):
            value = getattr(opts, key)
            if value is not None:
                lines.append(f"#SBATCH --{key.replace('_', '-')}={q(str(value))}")
        lines += [f"#SBATCH {q(x)}" for x in opts.extra]
        lines += ["", "set -euo pipefail"]
        if arbitrary:
            counts = " ".join(str(len(self.plan.host_records(h.index))) for h in job.hosts)
            hostfile = q(str(self.paths.root / "hostfile.")) + "$SLURM_JOB_ID"
            lines += [
                "# uneven hosts: one hostfile line per task, in rank order, for --distribution=arbitrary",
                'nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))',
                f"counts=({counts})",
                f"export SLURM_HOSTFILE={hostfile}",
                'for i in "${!counts[@]}"; do for ((j = 0; j < counts[i]; j++)); do echo "${nodes[i]}"; done; done > "$SLURM_HOSTFILE"',
            ]
        lines.append(shlex.join(self.srun_argv()))
        return "\n".join(lines) + "\n"

    def request(self) -> LaunchRequest:
        pins = {"run_id": self.paths.run_id}
        if self.in_allocation:
            cmd = HostCommand("this allocation", self.srun_argv(), "an srun step inside the current allocation",
                              cwd=self.invocation.cwd)
            return LaunchRequest(self.name, (cmd,), pins=pins)
        script_path = str(self.paths.sbatch_script)
        cmd = HostCommand("this machine (login node)", ("sbatch", "--parsable", script_path),
                          "submits the batch script below", cwd=self.invocation.cwd)
        return LaunchRequest(self.name, (cmd,), files={self.paths.sbatch_script.name: self.script()}, pins=pins)
