"""A task a scheduler starts: ``python -P -m runner.app.task <run folder>/spec.yaml`` (the command that
launcher=slurm and launcher=mpi print and run; ``-P``: the folder it starts in is not put on the path,
so a ``runner.py`` or ``runner/`` of the user's cannot shadow the runner).

It runs through the one host-side entry (runner.app.host_entry), which :class:`SchedulerTask` adapts: it loads the
spec the launch pinned, validates and plans it again on the node it landed on (its launcher fills in what only the
allocation knows: Slurm's first node and port), finds its place from the scheduler's environment (the launcher the
spec names reads it: Slurm's variables or an MPI flavour's), refuses a place that contradicts the plan (with both
numbers), and runs its share: with ``launcher.tasks=per_host`` it forks its host's processes as launcher=local does;
with ``per_device`` it is one rank itself, and rank 0 serves the rendezvous store, as torch does. It has no restarts
of its own: a requeued Slurm job, or mpirun started again, starts its tasks again.

``--round N``: the task of round N of a job that outlives its nodes (runner.launchers.slurm.rounds: an srun step the
`run` that holds the job started, on the nodes that remain): it runs attempt N, restarts its share as an ssh host's
does (launcher.max_restarts), and says what it does on its stderr as report lines (runner.worker.agent_reports), with
an :class:`~runner.worker.agent_reports.Alive` every launcher.slurm.keepalive_s from a thread of its own, which also
hears the holder (:class:`RoundWatch`).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from runner.app.host_entry import HolderGone, Placed, Refused, enter
from runner.common.signals import StopRequest
from runner.environments.process import ProcessEnvironment
from runner.launchers import LAUNCHERS
from runner.launchers.base import TaskError, TaskPlace
from runner.launchers.elastic.liveness import BEATS_MISSED
from runner.launchers.slurm.rounds import read_holder_beat
from runner.plan.processes import Plan
from runner.records.paths import RunPaths
from runner.spec.document import load_spec
from runner.spec.job import Job
from runner.spec.schema import JobConfig, TaskMode
from runner.worker.agent_reports import Alive, say_report
from runner.worker.share import HostShare


def verify_place(plan: Plan, place: TaskPlace) -> None:
    job = plan.job
    per_host = job.spec.launcher.tasks is TaskMode.per_host
    expected = len(job.hosts) if per_host else plan.world_size
    what = "one task per host" if per_host else "one task per process"
    counts = tuple(1 if per_host else n for n in plan.processes_per_host)
    if place.nodes is not None and place.nodes != len(job.hosts):
        raise TaskError(f"{place.source} started the step on {place.nodes} node(s), but the spec has {len(job.hosts)} "
                        f"host(s) (topology); hint: allocate {len(job.hosts)} node(s) (sbatch/salloc --nodes="
                        f"{len(job.hosts)}), or change the topology to this allocation")
    if place.count != expected:
        raise TaskError(f"{place.source} started {place.count} task(s), but the spec needs {expected} "
                        f"(launcher.tasks={job.spec.launcher.tasks.value}: {what}); hint: start the job with the "
                        f"command `run` printed (launch.txt), or change the spec to this allocation")
    if place.tasks_per_node is not None and place.tasks_per_node != counts:
        raise TaskError(f"{place.source} placed {'+'.join(map(str, place.tasks_per_node))} task(s) on the step's nodes, "
                        f"but the spec needs {'+'.join(map(str, counts))} ({what}); hint: start the job with the "
                        f"command `run` printed (launch.txt), which places the tasks")
    if not per_host and place.local_index is not None:
        rec = plan.records[place.index]
        if place.local_index != rec.local_rank:
            raise TaskError(f"{place.source} placed task {place.index} as local task {place.local_index} of its node, "
                            f"but the plan has it as local rank {rec.local_rank} of host {rec.node_rank}; hint: the "
                            f"allocation's tasks per node differ from the topology's devices per host")


@dataclass(frozen=True)
class SchedulerTask:
    """A scheduler's task's adapter to the host-side entry (runner.app.host_entry): the spec ``spec_path`` (the run
    folder's), the place from the scheduler's variables; ``round_``: the round of a job that outlives its nodes (the
    module docstring), None for a plain task."""

    spec_path: Path
    round_: int | None = None

    @classmethod
    def of(cls, argv: list[str]) -> SchedulerTask | None:
        """From ``<spec> [--round N]``; None: not that."""
        if len(argv) == 3 and argv[1] == "--round" and argv[2].isdigit():
            return cls(Path(argv[0]).resolve(), int(argv[2]))
        return cls(Path(argv[0]).resolve()) if len(argv) == 1 else None

    @property
    def restarts_itself(self) -> bool:
        return self.round_ is not None

    def spec(self) -> JobConfig:
        """The run's one spec, as `run` pinned and wrote it; its workdir must be there on this host."""
        spec = load_spec(self.spec_path)
        if spec.workdir and not os.path.isdir(spec.workdir):
            raise Refused(f"error: workdir: the job's folder {spec.workdir} is not on this host "
                          f"({socket.gethostname()}); hint: start `run` from a folder every host sees (a shared "
                          f"filesystem), or set workdir= to one")
        return spec

    def place(self, job: Job, environment: ProcessEnvironment) -> Placed:
        launcher, folder = LAUNCHERS[job.spec.launcher.kind], self.spec_path.parent
        try:
            place = launcher.task_place(environment)
            attempt = place.attempt if self.round_ is None else self.round_
            paths = RunPaths(folder, job.spec.run_id or folder.name, attempt)
            plan = launcher.host_plan(job, paths, environment)  # Slurm's first node and port filled in
            verify_place(plan, place)
        except (TaskError, RuntimeError, ValueError) as e:  # ValueError: a node list that does not parse
            raise Refused(f"error: {e}") from None
        if self.round_ is not None or job.spec.launcher.tasks is TaskMode.per_host:  # this host's agent
            return Placed(plan, place.index, paths)
        rec = plan.records[place.index]  # one task per process: the agent of its one rank (rank 0 serves the store)
        return Placed(plan, rec.node_rank, paths, only=rec.global_rank)

    def run(self, share: HostShare, only: int | None, early_stop: StopRequest | None, gone: HolderGone) -> int:
        from runner.worker.host_agent import HostAgent

        if self.round_ is None:
            # a task of its host's share says how it ended (its `run` is elsewhere); a task of one rank does not
            return HostAgent(share, announce=only is None, only=only, early_stop=early_stop).run()
        # a round of a job that outlives its nodes: restarts and reports as an ssh host's share
        host, every_s = share.node_rank, share.plan.job.spec.launcher.slurm.keepalive_s
        RoundWatch(share.paths, self.round_, host, every_s, gone).start()
        return HostAgent(share, announce=True, early_stop=early_stop,
                         reporter=lambda report: say_report(replace(report, host=host))).run()


class RoundWatch:
    """How a round's task hears its holder, from a thread of its own: it says :class:`Alive` every ``every_s`` (the
    holder finds a silent node lost), and reads the holder's beat in the run folder
    (runner.launchers.slurm.rounds.write_holder_beat): once the holder is at another round, or silent for twice as
    long as it would take a node to be lost, the holder is gone for this task (``gone``: its share stops as on
    SIGTERM, and ends with this process after the hard stop). A node the holder lost while its task ran on (its slurmd
    stopped: Slurm cannot reach the step there) so leaves nothing behind."""

    def __init__(self, paths: RunPaths, round_: int, host: int, every_s: float, gone: Callable[[str], None]) -> None:
        self.paths, self.round, self.host = paths, round_, host
        self.every_s, self.gone = max(1.0, every_s), gone

    def start(self) -> None:
        threading.Thread(target=self._run, name="round-watch", daemon=True).start()

    def _run(self) -> None:
        last, changed = None, time.monotonic()
        silent_s = 2 * BEATS_MISSED * self.every_s
        while True:
            say_report(Alive(at=time.time(), host=self.host))
            beat = read_holder_beat(self.paths)
            if beat is not None and beat != last:
                last, changed = beat, time.monotonic()
            if beat is not None and beat[0] != self.round:
                return self.gone(f"run: the job is at attempt {beat[0] + 1} (this task ran attempt {self.round + 1}): "
                                 f"stopping this node's share")
            if time.monotonic() - changed >= silent_s:
                return self.gone(f"run: no beat from the `run` that holds the job's rounds for {silent_s:g} s "
                                 f"({self.paths.rounds_beat}): stopping this node's share")
            time.sleep(self.every_s)


def main() -> None:
    """A task lives on after SIGQUIT (its ranks dump their stacks); Slurm may send its stop signal early (a short
    time limit, a preemption): remembered rather than died of (runner.app.host_entry.enter)."""
    enter(SchedulerTask.of(sys.argv[1:]), "usage: python -P -m runner.app.task <run folder>/spec.yaml [--round N]")


if __name__ == "__main__":
    main()
