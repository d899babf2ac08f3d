"""launcher=mpi: one `mpirun` (Open MPI syntax) that places ranks with -H host:slots."""

from __future__ import annotations

import shlex

from runner.launchers.base import HostCommand, Launcher, LaunchRequest, run_forwarding_signals
from runner.spec.schema import TaskMode
from runner.common.signals import stop_signal


class MpiLauncher(Launcher):
    name = "mpi"

    def request(self) -> LaunchRequest:
        job, opts = self.plan.job, self.plan.job.spec.launcher.mpi
        per_host = job.spec.launcher.tasks is TaskMode.per_host
        slots = [1 if per_host else len(self.plan.host_records(h.index)) for h in job.hosts]
        hosts = ",".join(f"{h.reach or 'localhost'}:{n}" for h, n in zip(job.hosts, slots))
        argv = [opts.mpirun]
        if opts.allow_run_as_root:
            argv.append("--allow-run-as-root")
        if opts.oversubscribe:
            argv.append("--oversubscribe")
        # map by slot: -H order and slot counts give rank blocks per host, the plan's prefix sums
        argv += ["-np", str(sum(slots)), "-H", hosts, "--map-by", "slot", "--bind-to", "none"]
        for name in opts.export:
            argv += ["-x", name]  # Open MPI passes only its own variables to other hosts unless told
        argv += [*opts.extra, *self.task_argv()]
        pins = self.pins(port=True)
        what = "one task per host, each forks its processes" if per_host else "one MPI rank per process"
        return LaunchRequest(self.name, (HostCommand("this machine", tuple(argv), what, cwd=self.invocation.cwd),),
                             pins=pins)

    def launch(self, request: LaunchRequest, recipe_cfg) -> int:
        import signal
        import sys

        (command,) = request.commands
        print(f"mpi: {shlex.join(command.argv)}", file=sys.stderr, flush=True)
        stop = stop_signal(self.plan.job.spec.launcher.slurm.signal)
        try:
            return run_forwarding_signals(list(command.argv), command.cwd, (signal.SIGINT, signal.SIGTERM, stop),
                                          self.rank_failed)
        except FileNotFoundError:
            print(f"error: launcher=mpi: {command.argv[0]!r} is not on PATH; hint: install Open MPI, or give its path: "
                  f"launcher.mpi.mpirun=/path/to/mpirun", file=sys.stderr)
            return 2
