"""launcher=slurm for a job that outlives its nodes (topology.min_nodes, topology.spares: runner.spec.elastic): its
srun steps, one a round (runner.launchers.elastic.rounds), held by a `run` of their own, ``python -P -m
runner.app.slurm_rounds <run folder>/spec.yaml``, which the batch script runs (sbatch --no-kill: a node lost does not
end the allocation) or `run` inside salloc runs.

Each round is an srun step of the allocation on the round's nodes (``--nodelist``; ``--overlap``: a step's resources
on a lost node are freed only once Slurm gives the node up), one task per node (launcher.tasks=per_host) started as
``runner.app.task ... --round N``: it runs attempt N, restarts its share in place after a rank's failure as an ssh
host's does, and says what it does as report lines on its stderr (runner.worker.agent_reports), an ``Alive`` every
launcher.slurm.keepalive_s among them. A node is lost when

- its task falls silent while srun runs: no line from it for :data:`BEATS_MISSED` intervals (the node died, its
  network went, its task was killed); or
- Slurm takes it out of the job (``scontrol show job``: it marked the node down, SlurmdTimeout after it last heard
  its slurmd).

Where both say something, Slurm's word wins: a node Slurm gives up on has the step's tasks on the other nodes killed,
and those fall silent while the lost node's task, which Slurm cannot reach, may still run. Then srun is sent SIGTERM:
Slurm cancels the step on the nodes it reaches; srun is killed once each of those nodes' tasks has ended (srun says
so), or :data:`STEP_END_WAIT_S` later. The next round starts on the nodes that remain, renumbered, with a spare (a
node of the allocation the spec names in topology.spares) in a lost one's place.

The holder says it is there to the tasks too, in the run folder every node sees (:func:`write_holder_beat`): a task
whose round is over (its node lost to the holder, but still running: a slurmd that stopped while its step ran) or
whose holder fell silent stops its share by itself (runner.app.task).
"""

from __future__ import annotations

import dataclasses
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from runner.common import exits
from runner.common.signals import passing_on
from runner.environments.slurm import expand_hostnames
from runner.launchers.base import LaunchOutcome
from runner.launchers.elastic.liveness import BEATS_MISSED, silent_after_s
from runner.launchers.elastic.membership import Candidate, job_on
from runner.launchers.elastic.rounds import Ended, Returns
from runner.plan.processes import Plan
from runner.records.paths import RunPaths
from runner.spec.document import load_spec, spec_yaml
from runner.spec.job import Job
from runner.spec.schema import HostConfig, JobConfig
from runner.worker.agent_reports import AgentReport, parse_report

SLURM_ASKED_EVERY_S = 5.0  # how often Slurm is asked which nodes the job still has
STEP_END_WAIT_S = 15.0  # after srun's SIGTERM, how long it may wait for a lost node before it is killed
TICK_S = 0.2
_TASK_ENDED = re.compile(rb"^srun: error: (\S+): tasks? [\d,\-]+: ")  # srun's line for a node's ended task(s)
Planner = Callable[[JobConfig, RunPaths], Plan]  # a round's spec -> its plan (SlurmLauncher.plan_for of its job)


def write_holder_beat(paths: RunPaths, attempt: int, count: int) -> None:
    """The holder is there, at round ``attempt`` (``count``: a number that changes at every beat)."""
    path = paths.rounds_beat
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        temporary.write_text(f"{attempt} {count}\n")
        os.replace(temporary, path)
    except OSError:
        pass


def read_holder_beat(paths: RunPaths) -> tuple[int, int] | None:
    """(round, count) the holder last wrote; None: nothing readable."""
    try:
        attempt, count = paths.rounds_beat.read_text().split()
        return int(attempt), int(count)
    except (OSError, ValueError):
        return None


def rounds_run(paths: RunPaths) -> list[int]:
    """The attempts whose round specs the run folder holds, in order."""
    found = []
    pattern = paths.round_spec("*").name
    before, after = pattern.split("*")
    for path in paths.root.glob(pattern):
        number = path.name.removeprefix(before).removesuffix(after)
        if number.isdigit():
            found.append(int(number))
    return sorted(found)


def nodes_of_job(job_id: str) -> set[str] | None:
    """The nodes Slurm counts in the job now (``scontrol show job``); None where it does not say."""
    try:
        done = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True,
                              timeout=SLURM_ASKED_EVERY_S * 2)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return nodes_listed(done.stdout)


def nodes_listed(record: str) -> set[str] | None:
    """The NodeList of a ``scontrol show job -o`` record, expanded; None without one."""
    nodes = next((part.split("=", 1)[1] for part in record.split() if part.startswith("NodeList=")), "")
    try:
        return set(expand_hostnames(nodes)) if nodes and nodes != "(null)" else None
    except ValueError:
        return None


def last_round_plan(paths: RunPaths, job: Job, planner: Planner) -> Plan | None:
    """The plan of the last round the run folder has a spec of; None: none ran (or its spec does not read)."""
    attempts = rounds_run(paths)
    if not attempts:
        return None
    try:
        round_job = job_on(job, load_spec(paths.round_spec(attempts[-1])))
    except (OSError, ValueError):
        return None
    return planner(round_job, dataclasses.replace(paths, attempt=attempts[-1]))


def pinned_to_nodes(spec: JobConfig, nodes: Sequence[str]) -> JobConfig:
    """``spec`` with every host named: its own names where it gives them, else the allocation's nodes in order (Slurm
    starts a step's tasks in node order, and the rounds name the nodes they run on)."""
    hosts = spec.topology.hosts
    if hosts and all(h.name for h in hosts):
        return spec
    count = len(hosts) if hosts else spec.topology.nodes or 1
    if len(nodes) < count:
        raise ValueError(f"{count} host(s) in the spec, {len(nodes)} node(s) in the allocation")
    per_node = spec.topology.devices_per_node
    named = [dataclasses.replace(hosts[i], name=nodes[i]) if hosts else HostConfig(name=nodes[i], devices=per_node)
             for i in range(count)]
    topology = dataclasses.replace(spec.topology, hosts=named, nodes=None, hostfile=None)
    return dataclasses.replace(spec, topology=topology)


@dataclass
class _LastHeard:
    """When each host of a round was last heard (this machine's monotonic clock), and which are lost, why."""

    last: dict[int, float] = field(default_factory=dict)
    lost: dict[int, str] = field(default_factory=dict)
    lost_at: float | None = None

    def lose(self, host: int, why: str) -> None:
        if host not in self.lost:
            self.lost[host] = why
            self.lost_at = self.lost_at or time.time()

    def silent(self, now: float, after_s: float) -> Iterator[tuple[int, float]]:
        """Hosts heard once and not for ``after_s`` since, with how long."""
        for host, at in self.last.items():
            if host not in self.lost and now - at >= after_s:
                yield host, now - at


class SlurmRound:
    """One round: an srun step on ``plan``'s hosts (named after the allocation's nodes), at ``paths.attempt``."""

    def __init__(self, *, plan: Plan, paths: RunPaths, spec_path: Path, python: str, job_id: str,
                 planner: Planner, cwd: str | None = None) -> None:
        self.plan, self.paths, self.spec_path = plan, paths, spec_path
        self.python, self.job_id, self.planner, self.cwd = python, job_id, planner, cwd
        self.names = tuple(h.name or "" for h in plan.job.hosts)

    # -- the Round protocol (runner.launchers.elastic.rounds) ---------------------------------------------------------
    def on(self, spec: JobConfig, attempt: int) -> SlurmRound:
        """This round on another spec's hosts (those that remain after a loss), from ``attempt`` on; its spec is
        written where its tasks read it."""
        paths = dataclasses.replace(self.paths, attempt=attempt)
        return SlurmRound.of(spec, paths, self.plan.job, python=self.python, job_id=self.job_id,
                             planner=self.planner, cwd=self.cwd)

    @classmethod
    def of(cls, spec: JobConfig, paths: RunPaths, job: Job, *, python: str, job_id: str, planner: Planner,
           cwd: str | None) -> SlurmRound:
        job = job_on(job, spec)
        path = paths.round_spec(paths.attempt)
        path.write_text(spec_yaml(spec))
        return cls(plan=planner(job, paths), paths=paths, spec_path=path, python=python, job_id=job_id,
                   planner=planner, cwd=cwd)

    def left_out(self) -> dict[int, str] | LaunchOutcome:
        """Nothing to check before a step: srun refuses nodes the allocation does not have."""
        return {}

    def returns(self, candidates: Sequence[Candidate]) -> Returns | None:
        """None: no lost host is taken back (a node Slurm took out of the allocation does not come back to it; validation refuses topology.max_nodes)."""
        return None

    def sessions(self, on_report: Callable[[int, AgentReport], None] | None = None,
                 replacing: Sequence[str] = (), returns: Returns | None = None) -> tuple[Ended, list[str]]:
        """The round's step, to its end; how it ended (the run folder is every node's: nothing to take back)."""
        return Step(self, on_report).run(), []

    # -- the step --------------------------------------------------------------------------------------------------
    def argv(self) -> list[str]:
        spec = self.plan.job.spec
        n = len(self.names)
        argv = ["srun", "--kill-on-bad-exit=1", "--overlap", f"--nodes={n}", f"--ntasks={n}", "--ntasks-per-node=1",
                "--distribution=block", f"--nodelist={','.join(self.names)}"]
        cpus = spec.launcher.slurm.cpus_per_task or max(self.plan.processes_per_host)
        argv.append(f"--cpus-per-task={cpus}")
        return [*argv, self.python, "-P", "-m", "runner.app.task", str(self.spec_path), "--round",
                str(self.paths.attempt)]


class Step:
    """srun of one round, its stderr read for report lines (the rest shown), its nodes watched (the module
    docstring)."""

    def __init__(self, round_: SlurmRound, on_report: Callable[[int, AgentReport], None] | None,
                 nodes_of_job: Callable[[str], set[str] | None] = nodes_of_job) -> None:
        self.round, self.on_report, self.nodes_of_job = round_, on_report, nodes_of_job
        spec = round_.plan.job.spec
        self.silent_after_s = silent_after_s(max(1, spec.launcher.slurm.keepalive_s))
        self.stop_signal = round_.plan.rules.stop_signal
        self.heard = _LastHeard()
        self.lines: queue.Queue[AgentReport | None] = queue.Queue()
        self.signalled: int | None = None
        self.stopping = False  # a signal was passed on: this round's end is the job's
        self.ended_on: set[str] = set()  # nodes whose tasks srun said ended
        self.beats = 0

    def run(self) -> Ended:
        names = ", ".join(self.round.names)
        print(f"slurm: attempt {self.round.paths.attempt + 1}: an srun step on {len(self.round.names)} node(s) ({names})",
              file=sys.stderr, flush=True)
        write_holder_beat(self.round.paths, self.round.paths.attempt, 0)  # before the tasks look for it
        self.proc = subprocess.Popen(self.round.argv(), cwd=self.round.cwd, stderr=subprocess.PIPE)
        threading.Thread(target=self._read, name="srun-stderr", daemon=True).start()
        with passing_on(self.stop_signal, self._pass_on):
            code = self._watch()
        self._take_reports()
        if code and not self.stopping:
            self._silent_before_the_end()
        lost = frozenset(self.heard.lost)
        cause = "; ".join(f"{self.round.names[i]}: {why}" for i, why in sorted(self.heard.lost.items())) or None
        code = code if code >= 0 else exits.from_signal(-code)
        if self.signalled is not None and code:
            code = exits.from_signal(self.signalled)
        return Ended(code=code, signalled=self.signalled, cause=cause, lost=lost, lost_at=self.heard.lost_at,
                     why_lost=dict(self.heard.lost))

    def _pass_on(self, signum: int) -> None:
        self.stopping = True
        if signum in (signal.SIGINT, signal.SIGTERM) and self.signalled is None:
            self.signalled = signum
        try:
            self.proc.send_signal(signum)
        except ProcessLookupError:
            pass

    def _read(self) -> None:
        """srun's stderr: report lines to the queue, the rest to this process's stderr."""
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            report = parse_report(line)
            if report is not None:
                self.lines.put(report)
                continue
            if ended := _TASK_ENDED.match(line):
                self.ended_on.add(ended.group(1).decode(errors="replace"))
            sys.stderr.buffer.write(line)
            sys.stderr.buffer.flush()
        self.lines.put(None)

    def _take_reports(self) -> None:
        now = time.monotonic()
        while True:
            try:
                report = self.lines.get_nowait()
            except queue.Empty:
                return
            if report is None or report.host is None:
                continue
            self.heard.last[report.host] = now
            if self.on_report is not None:
                self.on_report(report.host, report)

    def _watch(self) -> int:
        """Until srun ends: its reports taken, its nodes watched; a lost one ends the step."""
        asked_slurm, ended_at = time.monotonic(), None
        while True:
            try:
                return self.proc.wait(TICK_S)
            except subprocess.TimeoutExpired:
                pass
            self._take_reports()
            now = time.monotonic()
            self.beats += 1
            write_holder_beat(self.round.paths, self.round.paths.attempt, self.beats)
            if ended_at is None and not self.stopping:
                silent = list(self.heard.silent(now, self.silent_after_s))
                if silent or now - asked_slurm >= SLURM_ASKED_EVERY_S:
                    asked_slurm = now
                    for host, why in self._out_of_the_job():  # Slurm's word first: its own kills silence the others
                        self.heard.lose(host, why)
                for host, quiet in silent if not self.heard.lost else ():
                    self.heard.lose(host, f"its task was silent for {quiet:.0f} s (launcher.slurm.keepalive_s="
                                          f"{self.silent_after_s / BEATS_MISSED:g}, {BEATS_MISSED} missed)")
                if self.heard.lost:
                    ended_at = now
                    lost = ", ".join(self.round.names[i] for i in sorted(self.heard.lost))
                    print(f"slurm: node(s) {lost} lost ({'; '.join(self.heard.lost.values())}): ending the step",
                          file=sys.stderr, flush=True)
                    self.proc.send_signal(signal.SIGTERM)
            elif ended_at is not None and (now - ended_at >= STEP_END_WAIT_S or self._survivors_ended()):
                self.proc.kill()

    def _survivors_ended(self) -> bool:
        """srun said the task of every node not lost has ended: what it still waits for is the lost nodes'."""
        kept = {name for i, name in enumerate(self.round.names) if i not in self.heard.lost}
        return kept <= self.ended_on

    def _out_of_the_job(self) -> list[tuple[int, str]]:
        """The round's nodes Slurm no longer counts in the job (it took them out: down, not responding)."""
        kept = self.nodes_of_job(self.round.job_id)
        if kept is None:
            return []
        return [(i, f"Slurm took node {name} out of the job (scontrol show node {name})")
                for i, name in enumerate(self.round.names) if name not in kept]

    def _silent_before_the_end(self) -> None:
        """A failed step that lost no node while it ran: one Slurm took out of the job, else a host silent well before
        the others were last heard, was lost before the step ended."""
        for host, why in self._out_of_the_job():
            self.heard.lose(host, why)
        if not self.heard.last or self.heard.lost:
            return
        latest = max(self.heard.last.values())
        for host, at in self.heard.last.items():
            if latest - at >= self.silent_after_s / 2:
                self.heard.lose(host, f"its task fell silent {latest - at:.0f} s before the step ended")
