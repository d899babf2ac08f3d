"""launcher=slurm: a batch script submitted with sbatch, or an srun step inside an allocation.

Its rules are runner.launchers.slurm.rules; what it submits is a request, materialized: the batch script
(runner.launchers.slurm.sbatch) and the srun step in it, or on its own inside an allocation
(runner.launchers.slurm.step). This class builds those from the plan, submits, and follows the job to its end
(runner.launchers.slurm.follow); a job that outlives its nodes is held by its own `run` (runner.app.slurm_rounds)."""

from __future__ import annotations

import dataclasses
import signal
import sys
from collections.abc import Iterator

from runner.common import exits
from runner.common.signals import parse_signal
from runner.environments.process import ProcessEnvironment
from runner.launchers.base import (HostCommand, Launcher, LaunchOutcome, LaunchRequest, TaskError, TaskPlace,
                                   run_forwarding_signals)
from runner.launchers.capabilities import Capabilities
from runner.launchers.slurm import rules
from runner.launchers.slurm.array import ArrayMember
from runner.launchers.slurm.follow import follow
from runner.launchers.slurm.job import SlurmError, submit
from runner.launchers.slurm.rounds import last_round_plan
from runner.launchers.slurm.sbatch import SbatchRequest, sbatch_request
from runner.launchers.slurm.step import SrunStep, rounds_said, srun_step
from runner.plan.processes import Deferred, Plan
from runner.records.outcomes import all_done
from runner.records.paths import RunPaths
from runner.reports.where import where_the_ranks_are
from runner.spec.elastic import declares_elasticity
from runner.spec.job import Job
from runner.spec.probe import MachineProbe
from runner.spec.problems import Problem, render_problems
from runner.spec.schema import JobConfig
from runner.spec.topology import Host


class SlurmLauncher(Launcher):
    name = "slurm"
    capabilities = Capabilities(
        restart_hint="launcher.slurm.requeue=true: the job is requeued after Slurm's stop signal, and resumes",
        sets_visible_devices=False,  # Slurm shows each task its node's GPUs
        master_source="first host of SLURM_STEP_NODELIST",
        survives_lost_hosts=True,  # the job's srun steps, one a round, on the nodes that remain (slurm.rounds)
        hosts_back_reason="a node that Slurm took out of the allocation does not come back to it (Slurm gives a job's "
                          "nodes once); the job goes on on the nodes that remain")

    # -- rules (runner.launchers.slurm.rules) and the master ----------------------------------------------------
    @classmethod
    def spec_problems(cls, spec: JobConfig) -> Iterator[Problem]:
        return rules.spec_problems(spec)

    @classmethod
    def job_problems(cls, job: Job, probe: MachineProbe) -> Iterator[Problem]:
        return rules.job_problems(job)

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

    @classmethod
    def snapshots_by_default(cls, environment: ProcessEnvironment) -> bool:
        return not environment.slurm.in_allocation  # a batch job starts, and is requeued, after the submission

    # -- the request ---------------------------------------------------------------------------------------
    @property
    def in_allocation(self) -> bool:
        """`run` runs inside salloc or a batch job: the launch is an srun step there, not a new submission."""
        return self.environment.slurm.in_allocation

    def sbatch(self) -> SbatchRequest:
        """The batch script this launch submits (its text: :meth:`SbatchRequest.materialize`)."""
        return sbatch_request(self.plan, self.paths, self.invocation.python, self.task_argv())

    def step(self) -> SrunStep:
        """The srun step this launch runs inside an allocation (its script: :meth:`SrunStep.materialize`)."""
        return srun_step(self.plan, self.paths, self.invocation.python, self.task_argv())

    def request(self) -> LaunchRequest:
        cwd, said = self.invocation.cwd, rounds_said(self.plan.job)
        if self.in_allocation:
            step = self.paths.step_script
            cmd = HostCommand(host="this allocation", argv=("bash", str(step)),
                              note="an srun step inside the current allocation", cwd=cwd)
            return LaunchRequest(launcher=self.name, commands=(cmd, *said), files={step.name: self.step().materialize()})
        cmd = HostCommand(host="this machine (login node)", argv=("sbatch", "--parsable", str(self.paths.sbatch_script)),
                          note="submits the batch script below", cwd=cwd)
        return LaunchRequest(launcher=self.name, commands=(cmd, *said),
                             files={self.paths.sbatch_script.name: self.sbatch().materialize()})

    def array_member(self) -> ArrayMember | None:
        """This job as a member of a sweep's job array (runner.launchers.slurm.array): its batch script
        is written, the array's script runs it. None inside an allocation (an srun step of its own)."""
        if self.in_allocation:
            return None
        own = ("#SBATCH --job-name=", "#SBATCH --output=", "#SBATCH --open-mode=")
        directives = tuple(line for line in self.sbatch().directives() if not line.startswith(own))
        opts = self.plan.job.spec.launcher.slurm
        return ArrayMember(paths=self.paths, ranks=tuple(r.global_rank for r in self.plan.records),
                           directives=directives, cwd=self.invocation.cwd, parallelism=opts.array_parallelism,
                           follow=opts.follow, stop_signal=self.plan.rules.stop_signal)

    # -- the launch ----------------------------------------------------------------------------------------
    def launch(self, request: LaunchRequest) -> LaunchOutcome:
        try:
            if self.in_allocation:
                return self._run_step(request.commands[0])
            self.paths.user_stop.unlink(missing_ok=True)  # an earlier launch's stop (a relaunch with the same run id)
            job_id = submit(self.paths.sbatch_script, self.invocation.cwd)
        except SlurmError as e:
            print(f"error: launcher=slurm: {e}", file=sys.stderr)
            return LaunchOutcome(code=exits.INVALID)
        return self._follow(job_id)

    def _run_step(self, step: HostCommand) -> LaunchOutcome:
        """Inside an allocation: the step script, once the allocation is found to fit the job."""
        slurm = self.environment.slurm
        problems = rules.allocation_problems(self.plan, slurm)
        if problems:
            print(render_problems(problems), file=sys.stderr)
            print("\nthe allocation does not fit the spec; nothing was started.", file=sys.stderr)
            return LaunchOutcome(code=exits.INVALID)
        print(f"slurm: an srun step in job {slurm.job_id} ({self.paths.step_script})", file=sys.stderr)
        ended = run_forwarding_signals(list(step.argv or ()), step.cwd, stop_signal=self.plan.rules.stop_signal,
                                       rank_failed=self.rank_failed)
        return dataclasses.replace(ended, plan=self._ended_on())

    def _follow(self, job_id: str) -> LaunchOutcome:
        """The submitted job, followed to its end unless launcher.slurm.follow=false."""
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
        return last_round_plan(self.paths, self.plan.job, self.plan_for) if declares_elasticity(self.plan.job.spec) \
            else None

    def _outcome(self) -> int:
        """0 when every rank of the run left its done file, else 1 (for a job Slurm forgot already)."""
        plan = self._ended_on() or self.plan
        return exits.OK if all_done(self.paths, (r.global_rank for r in plan.records)) else exits.FAILED
