"""launcher=mpi: one `mpirun` (Open MPI syntax) that places ranks with -H host:slots."""

from __future__ import annotations

import math
import os
import shlex
import sys
from collections.abc import Iterator

from runner.common import exits
from runner.environments.process import ProcessEnvironment
from runner.launchers.base import HostCommand, Launcher, LaunchRequest, TaskError, TaskPlace, named_hosts_problems
from runner.plan.processes import Deferred, port_for
from runner.records.paths import RunPaths
from runner.spec.job import Job
from runner.spec.probe import MachineProbe
from runner.spec.problems import Problem
from runner.spec.schema import JobConfig, TaskMode
from runner.spec.validation import ENV_NAME


STOP_MARGIN_S = 10  # after launcher.grace_s: the stop's report (where the ranks were, every host's records)
ATTEMPT = "RUNNER_ATTEMPT"  # tells each task which attempt it is (runner.environments.process)


class MpiLauncher(Launcher):
    name = "mpi"
    gives_mpi_ranks = True
    supports_restarts = True  # mpirun is started again, in the same run folder
    master_source = "host of MPI rank 0"
    pins_master_port = True

    @classmethod
    def spec_problems(cls, spec: JobConfig) -> Iterator[Problem]:
        for i, name in enumerate(spec.launcher.mpi.export):
            if not ENV_NAME.match(name):
                yield Problem(f"launcher.mpi.export[{i}]", f"{name!r} is not a variable name",
                              "names only, e.g. launcher.mpi.export=[HF_HOME,WANDB_API_KEY]")

    @classmethod
    def job_problems(cls, job: Job, probe: MachineProbe) -> Iterator[Problem]:
        yield from named_hosts_problems(job, cls.name)
        for h in job.hosts:
            if h.reach is not None and ":" in h.reach:
                yield Problem(f"topology.hosts[{h.index}].addr", f"{h.reach!r}: mpirun -H cannot take IPv6 literals "
                                                                 f"(host:slots would be ambiguous)",
                              "give the host's name instead (topology.hosts[i].name) and resolve it in /etc/hosts or DNS")

    @classmethod
    def master_port(cls, job: Job, paths: RunPaths | None) -> str:
        # the ranks on other hosts cannot learn a port chosen here at launch: they agree on one per run
        return str(port_for(paths.run_id)) if paths else Deferred.of("port derived from the run id")

    @classmethod
    def task_place(cls, environment: ProcessEnvironment) -> TaskPlace:
        mpi = environment.mpi
        if mpi is None:
            raise TaskError("launcher=mpi, but no MPI rank variables are set (OMPI_COMM_WORLD_RANK, PMI_RANK, ...)")
        return TaskPlace(index=mpi.rank, count=mpi.size, local_index=mpi.local_rank, source=mpi.flavour,
                         attempt=environment.attempt)

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
        # mpirun passes SIGINT/SIGTERM on to the tasks, then kills them after this many seconds (1 by default):
        # leave them launcher.grace_s to stop their ranks, the time to say where those were, and to report
        argv += ["--mca", "odls_base_sigkill_timeout", str(math.ceil(job.spec.launcher.grace_s) + STOP_MARGIN_S)]
        for name in opts.export:
            argv += ["-x", name]  # Open MPI passes only its own variables to other hosts unless told
        if job.spec.launcher.max_restarts:
            argv += ["-x", ATTEMPT]  # which attempt, for every task (set by launch)
        argv += [*opts.extra, *self.task_argv()]
        what = "one task per host, each forks its processes" if per_host else "one MPI rank per process"
        command = HostCommand(host="this machine", argv=tuple(argv), note=what, cwd=self.invocation.cwd)
        return LaunchRequest(launcher=self.name, commands=(command,))

    def launch(self, request: LaunchRequest) -> int:
        """Run mpirun; after a failure, up to launcher.max_restarts times again, each attempt's tasks told which
        it is (RUNNER_ATTEMPT): the ranks resume from the run's last checkpoint (ctx.attempt counts)."""
        (command,) = request.commands
        restarts = self.plan.job.spec.launcher.max_restarts
        attempt = 0
        while True:
            print(f"mpi: {shlex.join(command.argv)}", file=sys.stderr, flush=True)
            try:
                code = self.run_forwarding_signals(list(command.argv), command.cwd, {**os.environ, ATTEMPT: str(attempt)})
            except FileNotFoundError:
                print(f"error: launcher=mpi: {command.argv[0]!r} is not on PATH; hint: install Open MPI, or give its "
                      f"path: launcher.mpi.mpirun=/path/to/mpirun", file=sys.stderr)
                return exits.INVALID
            # a rank that raised (1) or was killed (mpirun's own status then), not `run` asked to stop
            if code in (exits.OK, exits.INVALID) or self.signalled or attempt >= restarts or self.stop_passed_on:
                return code
            attempt += 1
            print(f"\nrestarting: attempt {attempt + 1} of {restarts + 1} (launcher.max_restarts={restarts}): mpirun "
                  f"again; the recipe resumes from its last checkpoint", file=sys.stderr, flush=True)
