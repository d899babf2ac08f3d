"""A task a scheduler starts: ``python -P -m runner.app.task <run folder>/spec.yaml`` (the command that
launcher=slurm and launcher=mpi print and run; ``-P``: the folder it starts in is not put on the path,
so a ``runner.py`` or ``runner/`` of the user's cannot shadow the runner).

It loads the spec the launch pinned, validates and plans it again on the node it landed on (its launcher
fills in what only the allocation knows: Slurm's first node and port), finds its place from the
scheduler's environment (the launcher the spec names reads it: Slurm's variables or an MPI flavour's),
refuses a place that contradicts the plan (with both numbers), and runs its share: with
``launcher.tasks=per_host`` it forks its host's processes as launcher=local does; with ``per_device`` it
is one rank itself, and rank 0 serves the rendezvous store, as torch does.

``--round N``: the task of round N of a job that outlives its nodes (runner.launchers.slurm.rounds: an srun step the
`run` that holds the job started, on the nodes that remain): it runs attempt N, restarts its share as an ssh host's
does (launcher.max_restarts), and says what it does on its stderr as report lines (runner.worker.agent_reports), with
an :class:`~runner.worker.agent_reports.Alive` every launcher.slurm.keepalive_s from a thread of its own.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

from runner.common import exits
from runner.common.signals import StopRequest
from runner.environments.process import ProcessEnvironment
from runner.launchers import LAUNCHERS, validate
from runner.launchers.base import TaskError, TaskPlace
from runner.plan.processes import Plan
from runner.records.paths import RunPaths
from runner.spec.document import load_spec
from runner.spec.probe import LocalProbe
from runner.spec.problems import render_problems
from runner.spec.schema import TaskMode
from runner.spec.targets import TargetProblem
from runner.launchers.elastic.liveness import BEATS_MISSED
from runner.launchers.slurm.rounds import read_holder_beat
from runner.worker.agent_reports import Alive, say_report
from runner.worker.attempt_state import FAILURE_STOP_S, HARD_STOP_MARGIN_S
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


def tried_by_run(target: str, workdir: str | None) -> TargetProblem | None:
    """`run` tried the recipe target (or a script's module) where it was started (runner.spec.targets); the ranks
    import it again."""
    return None


def run_task(spec_path: Path, environment: ProcessEnvironment, early_stop: StopRequest | None = None,
             round_: int | None = None) -> int:
    """The task's share of the run whose spec is ``spec_path``; its exit status. ``early_stop``: the stop signal
    caught before the host agent handles it (passed on to the ranks once they run); ``round_``: the round of a job
    that outlives its nodes (the module docstring)."""
    from runner.worker.host_agent import HostAgent

    spec = load_spec(spec_path)  # the run's one spec, as `run` pinned and wrote it
    launcher = LAUNCHERS.get(spec.launcher.kind)
    if spec.workdir and not os.path.isdir(spec.workdir):
        print(f"error: workdir: the job's folder {spec.workdir} is not on this host ({socket.gethostname()}); hint: "
              f"start `run` from a folder every host sees (a shared filesystem), or set workdir= to one", file=sys.stderr)
        return exits.INVALID
    job, problems = validate(spec, LocalProbe(try_target=tried_by_run, try_module=tried_by_run))
    if job is None or launcher is None:
        print(render_problems(problems), file=sys.stderr)
        return exits.INVALID
    try:
        place = launcher.task_place(environment)
        attempt = place.attempt if round_ is None else round_
        paths = RunPaths(spec_path.parent, spec.run_id or spec_path.parent.name, attempt)
        plan = launcher.host_plan(job, paths, environment)  # Slurm's first node and port filled in
        verify_place(plan, place)
    except (TaskError, RuntimeError, ValueError) as e:  # ValueError: a node list that does not parse
        print(f"error: {e}", file=sys.stderr)
        return exits.INVALID
    paths.make()
    if round_ is not None:  # a round of a job that outlives its nodes: restarts and reports as an ssh host's share
        hard_stop_s = max(0.0, spec.launcher.grace_s) + FAILURE_STOP_S + HARD_STOP_MARGIN_S
        RoundWatch(paths, round_, place.index, spec.launcher.slurm.keepalive_s, hard_stop_s).start()
        share = HostShare(plan=plan, node_rank=place.index, paths=paths, environment=environment,
                          restarts=0 if spec.preflight else spec.launcher.max_restarts)
        return HostAgent(share, announce=True, early_stop=early_stop, reporter=_reporter(place.index)).run()
    # no restarts of its own: a requeued Slurm job, or mpirun started again, starts its tasks again
    if spec.launcher.tasks is TaskMode.per_host:  # this task is its host's agent: it forks the host's processes
        share = HostShare(plan=plan, node_rank=place.index, paths=paths, environment=environment)
        return HostAgent(share, announce=True, early_stop=early_stop).run()
    # one task per process: this task is the agent of its one rank, which serves the store itself if rank 0
    rec = plan.records[place.index]
    share = HostShare(plan=plan, node_rank=rec.node_rank, paths=paths, environment=environment)
    return HostAgent(share, only=rec.global_rank, early_stop=early_stop).run()


def _reporter(host: int):
    return lambda report: say_report(replace(report, host=host))


class RoundWatch:
    """A round's task, from a thread of its own: says :class:`Alive` every ``every_s`` (the holder finds a silent node
    lost), and reads the holder's beat in the run folder (runner.launchers.slurm.rounds.write_holder_beat): once the
    holder is at another round, or silent for twice as long as it would take a node to be lost, this task's share
    stops as on SIGTERM, and whatever still runs ``hard_stop_s`` later ends with this process. A node the holder lost
    while its task ran on (its slurmd stopped: Slurm cannot reach the step there) so leaves nothing behind."""

    def __init__(self, paths: RunPaths, round_: int, host: int, every_s: float, hard_stop_s: float) -> None:
        self.paths, self.round, self.host = paths, round_, host
        self.every_s, self.hard_stop_s = max(1.0, every_s), hard_stop_s

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
                return self._stop(f"the job is at attempt {beat[0] + 1} (this task ran attempt {self.round + 1}): "
                                  f"stopping this node's share")
            if time.monotonic() - changed >= silent_s:
                return self._stop(f"no beat from the `run` that holds the job's rounds for {silent_s:g} s "
                                  f"({self.paths.rounds_beat}): stopping this node's share")
            time.sleep(self.every_s)

    def _stop(self, why: str) -> None:
        try:
            print(f"run: {why}", file=sys.stderr, flush=True)
        except (OSError, ValueError):
            pass
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(self.hard_stop_s)
        finally:  # nothing of this share outlives it (the ranks die with this process: PR_SET_PDEATHSIG)
            os._exit(exits.from_signal(signal.SIGTERM))


def _arguments(argv: list[str]) -> tuple[Path, int | None] | None:
    """``<spec> [--round N]``; None: not that."""
    if len(argv) == 3 and argv[1] == "--round" and argv[2].isdigit():
        return Path(argv[0]), int(argv[2])
    return (Path(argv[0]), None) if len(argv) == 1 else None


def main() -> None:
    # Slurm may send its stop signal early (a short time limit, a preemption): remember it rather than die of it;
    # the host agent passes it on once its ranks have started (runner.worker.host_agent)
    early_stop = StopRequest()
    early_stop.install(signal.SIGUSR1)  # the default; the agent handles the spec's own once it is read
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)  # a task lives on; its ranks dump their stacks
    found = _arguments(sys.argv[1:])
    if found is None:
        print("usage: python -P -m runner.app.task <run folder>/spec.yaml [--round N]", file=sys.stderr)
        raise SystemExit(exits.INVALID)
    spec_path, round_ = found
    code = run_task(spec_path.resolve(), ProcessEnvironment.read(), early_stop, round_)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
