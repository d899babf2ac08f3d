"""What every launcher is: the rules of its kind of launch, then a plan in, a request out (the exact
commands, which the dry run prints), and the launch.

A launcher is one module with one :class:`Launcher` subclass, registered in ``runner.launchers.LAUNCHERS``
under the name ``launcher.kind`` gives it. Its class owns what is particular to it:

* **validation** — :meth:`Launcher.spec_problems` (its options) and :meth:`Launcher.job_problems` (whether
  the resolved hosts and devices fit it), plus the facts of its kind of launch that validation, the plan and `run`
  ask: its :attr:`Launcher.capabilities` (runner.launchers.capabilities), declared once;
* **the master** — :meth:`Launcher.default_master` (the address when the spec names none) and
  :meth:`Launcher.launch_rules` (the port's policy, the stop signal, who sets CUDA_VISIBLE_DEVICES);
* **the plan** — :meth:`Launcher.plan_for`, the one place a plan is made from a spec, for `run` and for every
  process that plans the run again on its host (:meth:`Launcher.host_plan`), and :meth:`Launcher.resolved`: the
  values it left to the launch (Deferred), filled in where a host's share runs (Slurm's first node and port);
* **its pins** — :meth:`Launcher.pins`: what the launch fixes in the spec for every process (the run id, a port
  the hosts agree on), applied to the spec before the plan is made (runner.spec.pins);
* **its tasks' place** — :meth:`Launcher.task_place`, for a launcher whose scheduler starts
  ``python -P -m runner.app.task`` (Slurm, mpirun);
* **the launch** — :meth:`Launcher.request` (no side effects) and :meth:`Launcher.launch`, which says how it
  ended in a :class:`LaunchOutcome` (a scheduler's command run to its end: :func:`run_forwarding_signals`).
"""

from __future__ import annotations

import shlex
import signal
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, ClassVar

from runner.common import exits
from runner.common.signals import parse_signal, passing_on
from runner.environments.process import ProcessEnvironment
from runner.launchers.capabilities import Capabilities
from runner.plan.processes import Deferred, LaunchRules, Plan, make_plan
from runner.records.outcomes import any_failed
from runner.records.paths import RunPaths
from runner.spec.job import Job
from runner.spec.pins import Pins
from runner.spec.probe import MachineProbe
from runner.spec.problems import Problem
from runner.spec.schema import JobConfig
from runner.spec.topology import Host
from runner.worker.share import HostShare

if TYPE_CHECKING:
    from runner.launchers.slurm.array import ArrayMember
    from runner.worker.zygote import Zygote

# How a launcher that forks a host's processes in `run` starts them: through `run`'s launch agent (runner.app.agent)
HostRun = Callable[[HostShare], int]


class AgentRuns(Enum):
    """What of a launch `run`'s launch agent runs, where the launcher's ``capabilities.forks_here``
    (runner.app.agent): this host's share, handed to it once (the launch itself stays in `run`), or the whole launch
    (one that runs this host's shares one after another, each forked from the agent's zygote: a job that outlives
    its hosts, launcher=manual)."""

    share = "share"
    launch = "launch"


@dataclass(frozen=True, kw_only=True)
class Invocation:
    """How `run` was called, so that commands for other hosts or tasks can repeat it."""

    python: str  # interpreter for tasks the launcher starts
    cwd: str
    overrides: tuple[str, ...] = ()  # the command line's Hydra overrides
    config_dir: str | None = None  # --config-dir, if one was given
    config_name: str | None = None  # --config-name, if not the built-in `job`
    run_command: str = "run"  # the `run` executable, as other hosts should call it


@dataclass(frozen=True, kw_only=True)
class HostCommand:
    """What runs on one host (or on the submitting host): a command line, or a note for in-process work."""

    host: str
    argv: tuple[str, ...] | None
    note: str = ""
    cwd: str | None = None

    def render(self) -> str:
        lines = [f"# {self.host}: {self.note}" if self.note else f"# {self.host}"]
        if self.argv is not None:
            cmd = shlex.join(self.argv)
            lines.append(f"cd {shlex.quote(self.cwd)} && {cmd}" if self.cwd else cmd)
        return "\n".join(lines)


@dataclass(frozen=True, kw_only=True)
class LaunchRequest:
    """Everything a launch executes, materialized; the dry run prints it, the launch runs it."""

    launcher: str
    commands: tuple[HostCommand, ...]
    files: dict[str, str] = field(default_factory=dict)  # run-folder file name -> content (batch scripts)

    def materialize(self) -> str:
        parts = [c.render() for c in self.commands]
        for name, text in self.files.items():
            parts.append(f"# --- {name} ---\n{text.rstrip()}")
        return "\n\n".join(parts) + "\n"


@dataclass(frozen=True, kw_only=True)
class TaskPlace:
    """Where a scheduler put a task: its index among the step's tasks, and on its node."""

    index: int
    count: int
    local_index: int | None
    source: str  # who says so: "Slurm", "Open MPI", ...
    nodes: int | None = None  # nodes of the step, where the scheduler says
    tasks_per_node: tuple[int, ...] | None = None
    attempt: int = 0  # the scheduler's restart count (a requeued Slurm job)


@dataclass(frozen=True, kw_only=True)
class LaunchOutcome:
    """How a launch ended, as `run`'s summary tells it (runner.reports.run_summary): what :meth:`Launcher.launch`
    returns, so that what the summary reads is one value made when the launch is over, not what a launcher was left
    holding."""

    code: int  # the exit status of `run` (runner.common.exits)
    not_followed: str | None = None  # what a launch submitted and returned from without following it ("Slurm job 12")
    signalled: int | None = None  # SIGINT or SIGTERM that `run` got and passed on (to a scheduler's command, the hosts)
    cause: str | None = None  # why the job failed where no rank's record can say it (a host was lost)
    plan: Plan | None = None  # the plan the job ended on, where it is not the launcher's (a job that lost hosts)


class TaskError(Exception):
    """A task cannot take its place (not started by its scheduler, a place that contradicts the plan)."""


class Launcher(ABC):
    """Turns a plan into processes, and owns the rules of its kind of launch (see the module docstring).
    Subclasses set :attr:`name` and give :meth:`request` and :meth:`launch`; the rest has defaults."""

    name: ClassVar[str]
    capabilities: ClassVar[Capabilities] = Capabilities()  # what its kind of launch can do (each launcher says once)

    # -- rules, before there is a plan ----------------------------------------------------------------------
    @classmethod
    def spec_problems(cls, spec: JobConfig) -> Iterator[Problem]:
        """Problems of this launcher's own options."""
        return iter(())

    @classmethod
    def job_problems(cls, job: Job, probe: MachineProbe) -> Iterator[Problem]:
        """Whether the resolved job (hosts, devices) fits this launcher."""
        return iter(())

    @classmethod
    def default_master(cls, spec: JobConfig, hosts: tuple[Host, ...]) -> str | None:
        """The master of a multi-host job whose spec names none: host 0, as the hosts reach it; None: the
        launch finds it (see :meth:`launch_rules`'s master_source)."""
        return hosts[0].reach

    @classmethod
    def agent_runs(cls, job: Job) -> AgentRuns:
        """What `run`'s launch agent runs of this launch, where ``capabilities.forks_here`` (:class:`AgentRuns`)."""
        return AgentRuns.share

    @classmethod
    def master_port(cls, job: Job, paths: RunPaths | None) -> str:
        """The master port when the spec leaves it at 0: by default a free one, chosen at launch by host 0."""
        return Deferred.of("free port chosen at launch")

    @classmethod
    def stop_signal(cls, spec: JobConfig) -> signal.Signals:
        """The signal that asks the ranks to checkpoint and stop."""
        return parse_signal(spec.launcher.stop_signal)

    @classmethod
    def launch_rules(cls, job: Job, paths: RunPaths | None) -> LaunchRules:
        """What this launcher decides about the job's plan."""
        can = cls.capabilities
        return LaunchRules(master_port=cls.master_port(job, paths), master_source=can.master_source,
                           stop_signal=cls.stop_signal(job.spec), sets_visible_devices=can.sets_visible_devices,
                           hosts_start_apart=can.hosts_start_apart, tasks_end_together=can.tasks_end_together)

    @classmethod
    def plan_for(cls, job: Job, paths: RunPaths | None = None) -> Plan:
        """The job's plan under this launcher's rules (runner.plan.processes.make_plan), with the run's names when
        ``paths`` is given. Every entry makes its plan here — `run` (runner.app.launch), a scheduler's task
        (runner.app.task), an ssh host's `run` (runner.app.ssh_host) — so that each process of the run expands the
        one spec into the same ranks by the same rules. What only the launch knows stays Deferred (:meth:`resolved`)."""
        return make_plan(job, cls.launch_rules(job, paths), paths)

    @classmethod
    def resolved(cls, plan: Plan, environment: ProcessEnvironment) -> Plan:
        """``plan`` with what this launcher left to the launch (Deferred) filled in from ``environment``, where a
        host's share runs: a scheduler tells its tasks what it chose. By default there is nothing to fill in there
        (a port chosen at launch reaches the ranks through host 0's agent; one the hosts agree on is pinned in the
        spec), and the plan stays as it is."""
        return plan

    @classmethod
    def host_plan(cls, job: Job, paths: RunPaths, environment: ProcessEnvironment) -> Plan:
        """The plan as a host that runs a share of it sees it: made again there (:meth:`plan_for`, on the host's own
        devices and network) and :meth:`resolved` from what the host's environment says."""
        return cls.resolved(cls.plan_for(job, paths), environment)

    @classmethod
    def pins(cls, job: Job, paths: RunPaths) -> Pins:
        """What this launch fixes in the spec for every process: the run id, and the master port where the spec
        leaves it at 0 and the hosts cannot learn one chosen at launch (``capabilities.pins_master_port``: the port
        :meth:`master_port` agreed on for the run)."""
        port = None
        if cls.capabilities.pins_master_port and not job.spec.init.master_port:
            agreed = cls.master_port(job, paths)
            port = None if isinstance(agreed, Deferred) else int(agreed)
        return Pins(paths.run_id, port)

    @classmethod
    def snapshots_by_default(cls, environment: ProcessEnvironment) -> bool:
        """Whether this launch copies the job's code into the run folder unless launcher.snapshot_code says: where
        an attempt may start long after the submission (a batch job, a requeue)."""
        return False

    @classmethod
    def exported_names(cls, spec: JobConfig) -> tuple[str, ...]:
        """Variables whose values here this launch passes on itself (launcher.ssh.export), which `run` reads for it
        (ProcessEnvironment.with_exported)."""
        return ()

    @classmethod
    def task_place(cls, environment: ProcessEnvironment) -> TaskPlace:
        """Where the scheduler put this task (`python -P -m runner.app.task`), from its variables."""
        raise TaskError(f"launcher={cls.name} starts no tasks of its own: run the job with `run`")

    # -- one launch --------------------------------------------------------------------------------------
    def __init__(self, *, plan: Plan, paths: RunPaths, invocation: Invocation, environment: ProcessEnvironment,
                 run_host: HostRun | None = None, zygote: Callable[[], Zygote] | None = None) -> None:
        self.plan = plan
        self.paths = paths
        self.invocation = invocation
        self.environment = environment
        self._run_host = run_host
        # where a launch that runs this host's shares one after another forks their ranks (runner.worker.zygote): the
        # launch agent's, or a sweep's; None: it starts one of its own
        self.zygote = zygote

    @abstractmethod
    def request(self) -> LaunchRequest:
        """The exact commands this launch would execute (no side effects)."""

    @abstractmethod
    def launch(self, request: LaunchRequest) -> LaunchOutcome:
        """Run the job; how it ended: the exit status of `run` (runner.common.exits), and what the summary says
        besides."""

    def array_member(self) -> ArrayMember | None:
        """This job as a member of a sweep's Slurm job array, prepared and not submitted; None: this
        launcher launches it on its own."""
        return None

    def run_host(self, node_rank: int) -> int:
        """Start host ``node_rank``'s processes here and wait for them, starting them again after a failure up to
        launcher.max_restarts times: through the launch agent when `run` has one (runner.app.agent), else in
        this process."""
        spec = self.plan.job.spec
        share = HostShare(plan=self.plan, node_rank=node_rank, paths=self.paths, environment=self.environment,
                          restarts=0 if spec.preflight else spec.launcher.max_restarts)
        if self._run_host is not None:
            return self._run_host(share)
        from runner.worker.host_agent import launch_host

        return launch_host(share)

    def rank_failed(self) -> bool:
        """A rank of this run failed: it left its error file (runner.records.outcomes)."""
        return any_failed(self.paths, (r.global_rank for r in self.plan.records))

    def task_argv(self) -> tuple[str, ...]:
        """How a task started by a scheduler (srun, mpirun) enters the runner: it loads the pinned spec.
        ``-P``: not the folder the task starts in (the user's) but the installed runner (runner.app.task)."""
        return (self.invocation.python, "-P", "-m", "runner.app.task", str(self.paths.spec))


def named_hosts_problems(job: Job, launcher: str) -> Iterator[Problem]:
    """A launcher that reaches every host by name (manual, mpirun) needs a name or address for each."""
    hosts = job.hosts
    unnamed = [h.index for h in hosts if h.reach is None]
    if len(hosts) > 1 and unnamed:
        key = f"topology.hosts[{unnamed[0]}].name" if job.spec.topology.hosts else "topology.hosts"
        yield Problem(key, f"launcher={launcher} must know every host, but host(s) {unnamed} have no name or addr",
                      "name them: topology=2x2 'topology.hosts=[{name: a}, {name: b}]'")


def run_forwarding_signals(argv: list[str], cwd: str | None, *, stop_signal: signal.Signals,
                           rank_failed: Callable[[], bool]) -> LaunchOutcome:
    """Run a scheduler's command (srun) to its end, passing `run`'s SIGINT, SIGTERM and ``stop_signal`` on to it (it
    passes them to the tasks); the launch's outcome, with the first SIGINT or SIGTERM passed on. The exit status for
    `run`: 128 + n when `run` got signal n (SIGINT, SIGTERM) and the command failed; 1 when a rank failed
    (``rank_failed``: the scheduler may report the status of the tasks it stopped because of it instead, e.g. srun's
    143); else the command's."""
    proc = subprocess.Popen(argv, cwd=cwd)
    received: list[int] = []

    def pass_on(signum: int) -> None:
        received.append(signum)
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass

    with passing_on(stop_signal, pass_on):
        code = proc.wait()  # retried after each forwarded signal (PEP 475)
    code = code if code >= 0 else exits.from_signal(-code)
    stopped = [s for s in received if s in (signal.SIGINT, signal.SIGTERM)]
    signalled = stopped[0] if stopped else None
    if code and signalled is not None:
        return LaunchOutcome(code=exits.from_signal(signalled), signalled=signalled)
    return LaunchOutcome(code=exits.FAILED if code and rank_failed() else code, signalled=signalled)
