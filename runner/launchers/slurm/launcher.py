"""launcher=slurm: a batch script submitted with sbatch, or an srun step inside an allocation."""

from __future__ import annotations

import dataclasses
import re
import shlex
import signal
import sys
from collections.abc import Iterator

from runner.common import exits
from runner.common.signals import parse_signal
from runner.environments.process import ProcessEnvironment
from runner.environments.slurm import SlurmEnvironment, expand_hostnames
from runner.launchers.base import (HostCommand, Launcher, LaunchOutcome, LaunchRequest, TaskError, TaskPlace,
                                   run_forwarding_signals)
from runner.launchers.capabilities import Capabilities
from runner.launchers.slurm.array import ArrayMember
from runner.launchers.slurm.follow import follow
from runner.launchers.slurm.job import SlurmError, submit
from runner.launchers.slurm.rounds import last_round_plan
from runner.plan.processes import Deferred, Plan
from runner.records.outcomes import all_done
from runner.records.paths import RunPaths
from runner.reports.where import where_the_ranks_are
from runner.spec.elastic import declares_elasticity, elasticity
from runner.spec.job import Job
from runner.spec.probe import MachineProbe
from runner.spec.problems import Problem, Severity, render_problems
from runner.spec.schema import DeviceKind, JobConfig, TaskMode
from runner.spec.topology import Host


_SLURM_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")
_SLURM_SIGNAL = re.compile(r"^(R:|B:)?(SIG)?[A-Z0-9]+(@\d+)?$")


class SlurmLauncher(Launcher):
    name = "slurm"
    capabilities = Capabilities(
        restart_hint="launcher.slurm.requeue=true: the job is requeued after Slurm's stop signal, and resumes",
        sets_visible_devices=False,  # Slurm shows each task its node's GPUs
        master_source="first host of SLURM_STEP_NODELIST",
        survives_lost_hosts=True)  # the job's srun steps, one a round, on the nodes that remain (slurm.rounds)

    # -- rules ---------------------------------------------------------------------------------------------
    @classmethod
    def spec_problems(cls, spec: JobConfig) -> Iterator[Problem]:
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

    @classmethod
    def job_problems(cls, job: Job, probe: MachineProbe) -> Iterator[Problem]:
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
        yield from cls._elastic_problems(job)

    @classmethod
    def _elastic_problems(cls, job: Job) -> Iterator[Problem]:
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

    @classmethod
    def default_master(cls, spec: JobConfig, hosts: tuple[Host, ...]) -> str | None:
        return None  # the first node of the step, whichever Slurm allocates

    @classmethod
    def master_port(cls, job: Job, paths: RunPaths | None) -> str:
        return Deferred.of("port derived from SLURM_JOB_ID")

    @classmethod
    def stop_signal(cls, spec: JobConfig) -> signal.Signals:
        return parse_signal(spec.launcher.slurm.signal)  # what sbatch --signal sends before the time limit

    @classmethod
    def task_place(cls, environment: ProcessEnvironment) -> TaskPlace:
        slurm = environment.slurm
        if not slurm.in_step:
            raise TaskError("launcher=slurm, but this process is not an srun task (no SLURM_STEP_ID/SLURM_PROCID)")
        return TaskPlace(index=slurm.proc_id, count=slurm.ntasks or 0, local_index=slurm.local_id, source="Slurm",
                         nodes=slurm.step_num_nodes, tasks_per_node=slurm.step_tasks_per_node,
                         attempt=slurm.restart_count)

    @classmethod
    def resolved(cls, plan: Plan, environment: ProcessEnvironment) -> Plan:
        """Fill in what only the allocation knows, as each task finds it in Slurm's variables: the step's first node
        (the master, where the spec names none) and the port derived from the job id (where the spec pins none); the
        init URL then names them."""
        addr, port = plan.master_addr, plan.master_port
        if isinstance(addr, Deferred) or isinstance(port, Deferred):
            slurm = environment.slurm
            addr = slurm.first_host() if isinstance(addr, Deferred) else addr
            port = str(slurm.port()) if isinstance(port, Deferred) else port
        known = dataclasses.replace(plan, master_addr=addr, master_port=port)
        return dataclasses.replace(known, init_method=known.init_url(port))

    # -- the launch ----------------------------------------------------------------------------------------
    @property
    def in_allocation(self) -> bool:
        """`run` runs inside salloc or a batch job: the launch is an srun step there, not a new submission."""
        return self.environment.slurm.in_allocation

    def _counts(self) -> list[int]:
        return list(self.plan.processes_per_host)

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
        """The hosts' (and spares') names for --nodelist; None where Slurm picks."""
        hosts = self.plan.job.hosts
        return ",".join(h.name for h in (*hosts, *self.plan.job.spares)) if all(h.name for h in hosts) else None

    @property
    def _elastic(self) -> bool:
        """The job outlives its nodes: its srun steps are held by runner.app.slurm_rounds (runner.launchers.slurm.rounds)."""
        return declares_elasticity(self.plan.job.spec)

    def _nodes(self) -> int:
        """Nodes the job asks for: its hosts, and the spares kept ready."""
        return len(self.plan.job.hosts) + len(self.plan.job.spares)

    def step_lines(self, background: bool = False) -> list[str]:
        """The srun step, and for uneven hosts the hostfile that places its tasks 2+1 in rank order;
        ``background``: started with ``&``, its pid in ``$step`` (the batch script forwards signals);
        else srun replaces the shell, so that signals to the step script reach srun."""
        if self._elastic:
            command = shlex.join([self.invocation.python, "-P", "-m", "runner.app.slurm_rounds", str(self.paths.spec)])
            note = "# the job outlives its nodes: this `run` holds its srun steps, one a round on the nodes that remain"
            return [note, *([f"{command} &", "step=$!"] if background else [f"exec {command}"])]
        ntasks, per_node, arbitrary = self._layout()
        job = self.plan.job
        lines = []
        argv = ["srun", "--kill-on-bad-exit=1", f"--nodes={len(job.hosts)}", f"--ntasks={ntasks}"]
        if arbitrary:
            lines += ["# uneven hosts: one hostfile line per task, in rank order, for --distribution=arbitrary",
                      f"export SLURM_HOSTFILE={self.paths.hostfile_in_batch_script()}"]
            if self._nodelist():
                names = [h.name for h, n in zip(job.hosts, self.plan.processes_per_host) for _ in range(n)]
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
        stop = self.plan.rules.stop_signal
        lines = [
            "#!/bin/bash",
            f"# Written by `run` for run {self.paths.run_id}; submit with: sbatch {q(str(self.paths.sbatch_script))}",
            f"#SBATCH --job-name={q('run-' + self.paths.run_id)}",
            f"#SBATCH --nodes={self._nodes()}",
            f"#SBATCH --ntasks-per-node={per_node}",
            f"#SBATCH --time={opts.time}",
            f"#SBATCH --signal=B:{opts.signal.split(':')[-1]}",
            f"#SBATCH --output={q(str(self.paths.slurm_output('%j')))}",
            "#SBATCH --open-mode=append",
            "#SBATCH --requeue" if opts.requeue else "#SBATCH --no-requeue",
        ]
        if self._elastic:  # a node lost leaves the allocation to the others
            lines.append("#SBATCH --no-kill")
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
        marker = self.paths.user_stop.name
        then = ([f"# requeue the job, which resumes from its checkpoint; unless `run` wrote {marker} first (the user",
                 "# asked it to stop): then the job ends"] if opts.requeue
                else ["# end (launcher.slurm.requeue=true would requeue it after Slurm's time-limit signal)"])
        lines += [
            "",
            "set -uo pipefail",
            f"# SIG{name} asks the ranks to checkpoint and return: Slurm sends it to this script before the time limit",
            f"# (--signal), and `run` passes it on when it is sent it (kill -{name} <pid of run>); then the script will",
            *then,
            "stop_requested=0",
            f'trap \'stop_requested=1; echo "run: SIG{name} from Slurm: asking the ranks to checkpoint and stop" >&2; '
            f'kill -{name} "$step" 2>/dev/null\' {name}',
            *self.step_lines(background=True),
            'while kill -0 "$step" 2>/dev/null; do wait "$step"; done',
            'wait "$step"; status=$?',
        ]
        if opts.requeue:
            lines += [f'if [ "$stop_requested" = 1 ] && [ -e {q(str(self.paths.user_stop))} ]; then',
                      f'  echo "run: stopped at the user\'s request ({marker}): job $SLURM_JOB_ID ends, not requeued" >&2',
                      'elif [ "$stop_requested" = 1 ]; then',
                      '  echo "run: requeueing job $SLURM_JOB_ID; it resumes from its last checkpoint" >&2',
                      '  scontrol requeue "$SLURM_JOB_ID"',
                      "fi"]
        lines.append('exit "$status"')
        return "\n".join(lines) + "\n"

    def request(self) -> LaunchRequest:
        cwd = self.invocation.cwd
        if self.in_allocation:
            step = self.paths.step_script
            text = "\n".join(["#!/bin/bash", f"# Written by `run` for run {self.paths.run_id}: an srun step",
                              "set -euo pipefail", *self.step_lines()]) + "\n"
            cmd = HostCommand(host="this allocation", argv=("bash", str(step)),
                              note="an srun step inside the current allocation", cwd=cwd)
            return LaunchRequest(launcher=self.name, commands=(cmd, *self._rounds_said()), files={step.name: text})
        cmd = HostCommand(host="this machine (login node)", argv=("sbatch", "--parsable", str(self.paths.sbatch_script)),
                          note="submits the batch script below", cwd=cwd)
        return LaunchRequest(launcher=self.name, commands=(cmd, *self._rounds_said()),
                             files={self.paths.sbatch_script.name: self.script()})

    def _rounds_said(self) -> tuple[HostCommand, ...]:
        """What the dry run says of a job that outlives its nodes: how it goes on, and how a lost node is found."""
        if not self._elastic:
            return ()
        every = self.plan.job.spec.launcher.slurm.keepalive_s
        spares = ", ".join(h.label for h in self.plan.job.spares)
        return (HostCommand(host=elasticity(self.plan.job).line(), argv=None),
                HostCommand(host=f"each round an srun step on the nodes that remain (runner.app.slurm_rounds); a node is "
                                 f"lost when its task is silent for {4 * every} s (launcher.slurm.keepalive_s={every}) "
                                 f"or Slurm takes it out of the job" + (f"; spare node(s) {spares} idle in the "
                                                                        f"allocation until one takes a place" if spares
                                                                        else ""), argv=None))

    # -- launch ---------------------------------------------------------------------------------------
    def allocation_problems(self, slurm: SlurmEnvironment) -> list[Problem]:
        """What the current allocation lacks for this job: nodes, CPUs per node, GPUs, named hosts."""
        job, problems = self.plan.job, []
        need = self._nodes()
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
            except ValueError:
                allocated = set(named)
            missing = [n for n in named if n not in allocated]
            if missing:
                problems.append(Problem("topology.hosts", f"{', '.join(missing)} not in {where}'s nodes "
                                        f"({slurm.job_nodelist})", "allocate those nodes (salloc --nodelist=...), "
                                        "or leave the host names out and let Slurm choose"))
        return problems

    def launch(self, request: LaunchRequest) -> LaunchOutcome:
        slurm = self.environment.slurm
        try:
            if self.in_allocation:
                problems = self.allocation_problems(slurm)
                if problems:
                    print(render_problems(problems), file=sys.stderr)
                    print("\nthe allocation does not fit the spec; nothing was started.", file=sys.stderr)
                    return LaunchOutcome(code=exits.INVALID)
                step = request.commands[0]
                print(f"slurm: an srun step in job {slurm.job_id} ({self.paths.step_script})", file=sys.stderr)
                ended = run_forwarding_signals(list(step.argv or ()), step.cwd, stop_signal=self.plan.rules.stop_signal,
                                               rank_failed=self.rank_failed)
                return dataclasses.replace(ended, plan=self._ended_on())
            self.paths.user_stop.unlink(missing_ok=True)  # an earlier launch's stop (a relaunch with the same run id)
            job_id = submit(self.paths.sbatch_script, self.invocation.cwd)
        except SlurmError as e:
            print(f"error: launcher=slurm: {e}", file=sys.stderr)
            return LaunchOutcome(code=exits.INVALID)
        self.paths.slurm_job_id.write_text(job_id + "\n")
        output = self.paths.slurm_output(job_id)
        print(f"slurm: submitted job {job_id}; output: {output}, rank logs: {self.paths.logs}/", file=sys.stderr)
        if not self.plan.job.spec.launcher.slurm.follow:
            print(f"slurm: not following it (launcher.slurm.follow=false): `squeue -j {job_id}` shows it", file=sys.stderr)
            return LaunchOutcome(code=exits.OK, not_followed=f"Slurm job {job_id}")
        code = follow(job_id, output, outcome=self._outcome, rank_failed=self.rank_failed,
                      say_where=lambda: where_the_ranks_are(self.plan, self.paths, "cancelling the job"),
                      stop_signal=self.plan.rules.stop_signal, user_stop=self.paths.user_stop)
        return LaunchOutcome(code=code, plan=self._ended_on())

    def _ended_on(self) -> Plan | None:
        """The plan of the job's last round, where it outlives its nodes and ran rounds (None: this launch's plan)."""
        return last_round_plan(self.paths, self.plan.job, self.plan_for) if self._elastic else None

    @classmethod
    def snapshots_by_default(cls, environment: ProcessEnvironment) -> bool:
        return not environment.slurm.in_allocation  # a batch job starts, and is requeued, after the submission

    def array_member(self) -> ArrayMember | None:
        """This job as a member of a sweep's job array (runner.launchers.slurm.array): its batch script
        is written, the array's script runs it. None inside an allocation (an srun step of its own)."""
        if self.in_allocation:
            return None
        own = ("#SBATCH --job-name=", "#SBATCH --output=", "#SBATCH --open-mode=")
        directives = tuple(line for line in self.script().splitlines()
                           if line.startswith("#SBATCH ") and not line.startswith(own))
        opts = self.plan.job.spec.launcher.slurm
        return ArrayMember(paths=self.paths, ranks=tuple(r.global_rank for r in self.plan.records),
                           directives=directives, cwd=self.invocation.cwd, parallelism=opts.array_parallelism,
                           follow=opts.follow, stop_signal=self.plan.rules.stop_signal)

    def _outcome(self) -> int:
        """0 when every rank of the run left its done file, else 1 (for a job Slurm forgot already)."""
        plan = self._ended_on() or self.plan
        return exits.OK if all_done(self.paths, (r.global_rank for r in plan.records)) else exits.FAILED
