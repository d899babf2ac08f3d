"""launcher=mpi: one `mpirun` (Open MPI syntax) that places ranks with -H host:slots."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

from runner.common import exits
from runner.common.signals import passing_on
from runner.environments.process import ProcessEnvironment
from runner.launchers.base import (HostCommand, Launcher, LaunchOutcome, LaunchRequest, TaskError, TaskPlace,
                                   named_hosts_problems)
from runner.launchers.capabilities import Capabilities
from runner.plan.processes import Deferred, port_for
from runner.records.paths import RunPaths
from runner.spec.job import Job
from runner.spec.probe import MachineProbe
from runner.spec.problems import Problem
from runner.spec.schema import JobConfig, TaskMode
from runner.spec.validation import ENV_NAME
from runner.worker.channel import REACH_STORE_S, channel_of
from runner.worker.rank_process import die_with_parent


ATTEMPT = "RUNNER_ATTEMPT"  # tells each task which attempt it is (runner.environments.process)
WAIT_TICK_S = 0.1  # while mpirun runs, `run` looks for signals it got this often


class MpiLauncher(Launcher):
    """mpirun's own stop (Open MPI 4: on SIGINT or SIGTERM, and once a task has ended badly) sends the tasks
    SIGCONT, nothing for ``odls_base_sigkill_timeout`` seconds (1 by default), then SIGTERM, the same pause, then
    SIGKILL, and every pause is waited in full. So `run` does not leave a stop to mpirun: a signal to `run` reaches
    every task through the job's channel (host 0's store, as under launcher=manual), and the tasks end each attempt
    together, once host 0 has reported it (LaunchRules.tasks_end_together), so that mpirun's own kill, when it comes,
    finds nothing left to cut short."""

    name = "mpi"
    capabilities = Capabilities(
        gives_mpi_ranks=True,
        supports_restarts=True,  # mpirun is started again, in the same run folder
        lost_host_reason=("mpirun ends every process of the job once one host's is lost (Open MPI's run-time aborts the "
                          "job; its fault-tolerant ULFM mode is not what the ranks' torch.distributed uses)"),
        master_source="host of MPI rank 0",
        pins_master_port=True,
        tasks_end_together=True)

    def __init__(self, **launch: Any) -> None:
        super().__init__(**launch)
        # what `run` passed on while mpirun ran, which ends the launch rather than restart it
        self._signalled: int | None = None  # the first SIGINT or SIGTERM: the outcome's, too
        self._stop_passed_on = False  # the stop signal: the ranks checkpoint and stop

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
        slots = [1 if per_host else n for n in self.plan.processes_per_host]
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
        if job.spec.launcher.max_restarts:
            argv += ["-x", ATTEMPT]  # which attempt, for every task (set by launch)
        argv += [*opts.extra, *self.task_argv()]
        what = "one task per host, each forks its processes" if per_host else "one MPI rank per process"
        command = HostCommand(host="this machine", argv=tuple(argv), note=what, cwd=self.invocation.cwd)
        return LaunchRequest(launcher=self.name, commands=(command,))

    def launch(self, request: LaunchRequest) -> LaunchOutcome:
        """Run mpirun; after a failure, up to launcher.max_restarts times again, each attempt's tasks told which
        it is (RUNNER_ATTEMPT): the ranks resume from the run's last checkpoint (ctx.attempt counts)."""
        (command,) = request.commands
        restarts = self.plan.job.spec.launcher.max_restarts
        attempt = 0
        while True:
            print(f"mpi: {shlex.join(command.argv)}", file=sys.stderr, flush=True)
            try:
                code = self._run_mpirun(list(command.argv), command.cwd, {**os.environ, ATTEMPT: str(attempt)})
            except FileNotFoundError:
                print(f"error: launcher=mpi: {command.argv[0]!r} is not on PATH; hint: install Open MPI, or give its "
                      f"path: launcher.mpi.mpirun=/path/to/mpirun", file=sys.stderr)
                return LaunchOutcome(code=exits.INVALID)
            # a rank that raised (1) or was killed (mpirun's own status then), not `run` asked to stop
            if code in (exits.OK, exits.INVALID) or self._signalled or attempt >= restarts or self._stop_passed_on:
                return LaunchOutcome(code=code, signalled=self._signalled)
            attempt += 1
            print(f"\nrestarting: attempt {attempt + 1} of {restarts + 1} (launcher.max_restarts={restarts}): mpirun "
                  f"again; the recipe resumes from its last checkpoint", file=sys.stderr, flush=True)

    def _run_mpirun(self, argv: list[str], cwd: str | None, env: dict[str, str]) -> int:
        """Run mpirun to its end; the exit status for `run` (as :func:`runner.launchers.base.run_forwarding_signals` gives it).
        mpirun runs in a process group of its own (a Ctrl-C at the terminal reaches `run` alone), without the
        terminal's input, and dies with `run`. SIGINT, SIGTERM and the stop signal to `run` go to every task through
        the job's channel; where `run` cannot reach it, and for a second SIGINT or SIGTERM, to mpirun (its own stop)."""
        pending: list[int] = []
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, process_group=0,
                                preexec_fn=lambda: die_with_parent(signal.SIGTERM))
        with passing_on(self.plan.rules.stop_signal, pending.append):
            while True:
                try:
                    code = proc.wait(WAIT_TICK_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
                while pending:
                    self._pass_on(pending.pop(0), proc)
        code = code if code >= 0 else exits.from_signal(-code)
        if code and self._signalled is not None:
            return exits.from_signal(self._signalled)
        return exits.FAILED if code and self.rank_failed() else code

    def _pass_on(self, signum: int, proc: subprocess.Popen) -> None:
        """A signal `run` got while mpirun runs: to every task through the job's channel (the tasks' agents pass it
        on as they would their own), else to mpirun."""
        again = signum in (signal.SIGINT, signal.SIGTERM) and self._signalled is not None
        if signum in (signal.SIGINT, signal.SIGTERM):
            self._signalled = self._signalled or signum
        else:
            self._stop_passed_on = True
        if not again:
            channel = channel_of(self.paths, self.plan.job.spec.init, self.plan.master_addr, self.plan.master_port,
                                 REACH_STORE_S)
            if channel is not None:
                channel.request_stop(signum, socket.gethostname())
                return
            print(f"{signal.Signals(signum).name}: host 0's store cannot be reached from here: passed on to mpirun "
                  f"(its own stop)", file=sys.stderr, flush=True)
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass
