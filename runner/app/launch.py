"""One job from a composed spec: validate, plan, write what the run is, then dry-run or launch, and say how
it ended (runner.reports.run_summary)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from runner.app import snapshot
from runner.app.agent import LaunchAgent
from runner.app.snapshot import Snapshot, SnapshotError
from runner.common import exits
from runner.common.signals import handling
from runner.environments import provenance
from runner.environments.process import ProcessEnvironment
from runner.launchers import LAUNCHERS, validate
from runner.launchers.base import AgentRuns, Invocation, Launcher, LaunchRequest
from runner.launchers.slurm.array import ArrayMember
from runner.plan.processes import Plan
from runner.plan.render import batch_line, plan_table, verdict, write_plan
from runner.records.paths import RunPaths
from runner.reports.run_summary import report_run
from runner.reports.where import where_the_ranks_are
from runner.spec.document import spec_yaml
from runner.spec.job import Job
from runner.spec.pins import Pins, pinned
from runner.spec.probe import LocalProbe
from runner.spec.problems import Problem, Severity, errors, render_problems
from runner.spec.schema import InitMethod, JobConfig, ScriptRecipeConfig

if TYPE_CHECKING:
    from runner.worker.share import HostShare
    from runner.worker.zygote import Zygote


def _snapshot(spec: JobConfig, by_default: bool, paths: RunPaths) -> Snapshot | None:
    """launcher.snapshot_code: copy the job's code into the run folder (the launch pins the spec to the copy)."""
    wanted = spec.launcher.snapshot_code
    if wanted is False or (wanted is None and not by_default):
        return None
    workdir = Path(spec.workdir)
    copy = snapshot.take(workdir, paths.code, list(spec.launcher.snapshot_files), spec.launcher.snapshot_max_mb,
                         required=wanted is True)
    if copy is None:
        print(f"notice: launcher.snapshot_code: {workdir} is not in a git repository: the job imports its code from "
              f"there as it is when each attempt starts (launcher.snapshot_files names files to copy)", file=sys.stderr)
    return copy


def _pins_of(launcher: type[Launcher], job: Job, paths: RunPaths, copy: Snapshot | None) -> Pins:
    """What this launch fixes for every process of the run: the launcher's pins (the run id, a port the hosts agree
    on), and with a snapshot of the code, the copy as code_dir and a script's path in it."""
    pins = launcher.pins(job, paths)
    if copy is None:
        return pins
    recipe = job.spec.recipe
    script = snapshot.moved(recipe.path, Path(job.spec.workdir), copy.folder) \
        if isinstance(recipe, ScriptRecipeConfig) and recipe.path is not None else None
    return dataclasses.replace(pins, code_dir=str(copy.folder), script_path=script)


class _Refused(Exception):
    """A phase of :func:`run_job` refused the job before anything started; it printed why. ``code``: `run`'s exit
    status."""

    def __init__(self, code: int = exits.INVALID) -> None:
        super().__init__(code)
        self.code = code


def run_job(spec: JobConfig, *, out: Path, run_id: str, invocation: Invocation, environment: ProcessEnvironment,
            agent: LaunchAgent | None = None, defer_submit: bool = False,
            zygote: Callable[[], Zygote] | None = None) -> int | ArrayMember:
    """The job's exit status, through its phases: validate the spec, open its run folder, pin it (the one spec of
    the run), make its launcher and request, write the run's records, then print the dry run, or check what only
    the launch can, and launch it and say how it ended. ``out``: the run folder Hydra gave it; ``run_id``: its id
    unless the spec pins one; ``invocation``: how `run` was called; ``environment``: what `run` read of its own
    (runner.environments.process); ``agent``: `run`'s launch agent, which tries the recipe target and starts this
    host's processes (runner.app.agent), if it has one; with ``defer_submit`` (a sweep on Slurm), a batch job is
    prepared but not submitted: its :class:`ArrayMember` is returned for the sweep's job array. ``zygote``: where the
    recipe target is tried and the ranks are forked from when `run` runs this host's share itself (no launch agent:
    one for every job of a sweep)."""
    started = time.perf_counter()
    try:
        job, problems = _validate(spec, agent, zygote)
        launcher_class = LAUNCHERS[job.spec.launcher.kind]
        if agent is not None and (job.spec.dry_run or not launcher_class.capabilities.forks_here):
            agent.dismiss()  # it tried the target (validation); no process of this job starts from here
            agent = None
        whole = agent is not None and launcher_class.agent_runs(job) is AgentRuns.launch
        paths = _open_run_folder(job, launcher_class, out, run_id)
        job, copy = _pin(job, launcher_class, paths, environment)
        # handed to the agent whole, a launcher holds no way of its own to run a share: the agent's are used there
        launcher = launcher_class(plan=launcher_class.plan_for(job, paths), paths=paths, invocation=invocation,
                                  environment=environment.with_exported(launcher_class.exported_names(job.spec)),
                                  run_host=None if whole else agent.run_host if agent else _in_process(zygote),
                                  zygote=None if agent else zygote)
        request = launcher.request()
        _write_records(launcher, request, copy)
        if job.spec.dry_run:
            _show_dry_run(launcher, request, problems)
            return exits.OK
        _refuse_a_stale_rendezvous_file(launcher.plan, paths)
    except _Refused as e:
        return e.code
    shown = [p for p in problems if p.severity is Severity.warning]
    if shown:
        print(render_problems(shown), file=sys.stderr)
    if defer_submit and (member := launcher.array_member()) is not None:
        return member
    return _launch(launcher, request, started, agent if whole else None)


def _in_process(zygote: Callable[[], Zygote] | None) -> Callable[[HostShare], int] | None:
    """How `run` runs a host's share itself with ``zygote``'s ranks (None: the host agent starts its own)."""
    if zygote is None:
        return None
    from runner.worker.host_agent import launch_host

    return lambda share: launch_host(share, zygote())


def _validate(spec: JobConfig, agent: LaunchAgent | None,
              zygote: Callable[[], Zygote] | None = None) -> tuple[Job, list[Problem]]:
    """The resolved job and every problem short of an error (runner.launchers.validate); the recipe target is tried
    by the launch agent, where there is one, else in a child of ``zygote`` (`run`'s own, started once for every job
    of a sweep, which forks their ranks where they run here: a fork of a process that has imported torch, not a
    child of `run` that imports it again for every job), else in a child of `run`. Refused: the errors, printed."""
    # the job's folder (runner.spec.targets), for every process on every host: validation reads it
    spec.workdir = os.path.abspath(spec.workdir or os.getcwd())
    if agent is not None:
        probe = LocalProbe(agent.target_problem)
    elif zygote is not None:
        probe = LocalProbe(lambda target, workdir: zygote().target_problem(target, workdir))
    else:
        probe = LocalProbe()
    job, problems = validate(spec, probe)
    if job is None:
        print(render_problems(problems), file=sys.stderr)
        print(f"\nthe spec has {len(errors(problems))} error(s); nothing was started.", file=sys.stderr)
        raise _Refused
    return job, problems


def _open_run_folder(job: Job, launcher_class: type[Launcher], out: Path, run_id: str) -> RunPaths:
    """The run's folder, made: ``out``, named by the spec's run id (a relaunch with it continues the run), else by
    ``run_id``. Refused: several hosts started apart with no run id to share."""
    spec = job.spec
    if launcher_class.capabilities.hosts_start_apart and len(job.hosts) > 1 and spec.run_id is None and not spec.dry_run:
        print("error: run_id: several hosts must share one run id and port, but none is pinned; hint: run with "
              "dry_run=true and use the command it prints for each host", file=sys.stderr)
        raise _Refused
    paths = RunPaths(out, spec.run_id or run_id)
    if paths.spec.exists() and not spec.dry_run:  # outputs/runs/<run id>: the same run id is the same run
        print(f"notice: run_id={paths.run_id}: {paths.root}/ holds this run already; this launch continues it (a "
              f"recipe resumes from its checkpoint there)", file=sys.stderr)
    paths.make()
    return paths


def _pin(job: Job, launcher_class: type[Launcher], paths: RunPaths,
         environment: ProcessEnvironment) -> tuple[Job, Snapshot | None]:
    """The one spec of the run, pinned before anything reads it (the plan and this host's processes take it;
    spec.yaml, for a scheduler's tasks, and the manual launch's commands, for the other hosts, are written from
    it), and the copy of the code it is pinned to, if one was taken. Refused: a snapshot that cannot be taken."""
    try:
        copy = _snapshot(job.spec, launcher_class.snapshots_by_default(environment), paths)
    except SnapshotError as e:
        print(f"error: {e}\n\nnothing was started.", file=sys.stderr)
        raise _Refused from None
    return pinned(job, _pins_of(launcher_class, job, paths, copy)), copy


def _write_records(launcher: Launcher, request: LaunchRequest, copy: Snapshot | None) -> None:
    """What the run is, in its folder, before anything starts: provenance.json, spec.yaml, plan.json, launch.txt
    and the request's files (a batch script)."""
    plan, paths = launcher.plan, launcher.paths
    spec = plan.job.spec
    paths.provenance.write_text(json.dumps(
        provenance.record(paths.run_id, spec.workdir, [h.label for h in plan.job.hosts],
                          str(copy.folder) if copy else None).document(), indent=1))
    paths.spec.write_text(spec_yaml(spec))
    write_plan(plan, paths.plan)
    paths.launch.write_text(request.materialize())
    for name, text in request.files.items():
        (paths.root / name).write_text(text)


def _show_dry_run(launcher: Launcher, request: LaunchRequest, problems: list[Problem]) -> None:
    """The dry run on stdout: the spec, the verdict and its problems, the plan, the exact launch."""
    plan = launcher.plan
    spec = plan.job.spec
    print("== spec ==")
    print(spec_yaml(spec).rstrip())
    print("\n== verdict ==")
    print(verdict(plan))
    if (batch := batch_line(plan)) is not None:
        print(batch)
    if problems:
        print(render_problems(problems))
    print("\n== plan ==")
    print(plan_table(plan))
    print(f"\n== launch ({spec.launcher.kind}) ==")
    print(request.materialize().rstrip())
    print(f"\ndry run: nothing was started. Spec, plan and commands are in {launcher.paths.root}/")


def _refuse_a_stale_rendezvous_file(plan: Plan, paths: RunPaths) -> None:
    """init=file: a rendezvous file left by an earlier run would be read as this one's. Checked by the launchers
    that start every host at once; hosts started by hand come one by one."""
    spec = plan.job.spec
    if spec.init.method is not InitMethod.file or plan.rules.hosts_start_apart:
        return
    from runner.worker.rendezvous import RendezvousError, stale_rendezvous_file
    try:
        stale_rendezvous_file(paths.rendezvous_file(spec.init.dir))
    except RendezvousError as e:
        print(f"error: init: {e}", file=sys.stderr)
        raise _Refused from None


def _say_where(plan: Plan, paths: RunPaths) -> None:
    """Ctrl-\\ (or kill -QUIT): where the ranks are. Hosts started apart (launcher=manual) share no run folder: the
    ranks of every host are asked and heard through the job's channel, which this `run` reaches as its ranks do."""
    from runner.worker.channel import REACH_STORE_S, channel_of, where_through

    channel = None
    if plan.rules.hosts_start_apart and len(plan.job.hosts) > 1:
        known = plan.master_known
        channel = channel_of(paths, plan.job.spec.init, plan.master_addr if known else None,
                             plan.master_port if known else None, REACH_STORE_S)
        if channel is None:
            print("where the ranks are: host 0's store cannot be reached; asking this host's ranks only",
                  file=sys.stderr, flush=True)
    where_the_ranks_are(plan, paths, **where_through(channel))


def _launch(launcher: Launcher, request: LaunchRequest, started: float, agent: LaunchAgent | None = None) -> int:
    """Launch (in ``agent``, where the launcher's agent runs it whole: runner.launchers.base.AgentRuns), answering
    Ctrl-\\ (or kill -QUIT) with where the ranks are; then the run on one screen, and run_summary.json."""
    plan, paths = launcher.plan, launcher.paths
    with handling((signal.SIGQUIT,), lambda _s, _f: _say_where(plan, paths)):
        outcome = agent.launch(launcher, request) if agent is not None else launcher.launch(request)
    report_run(outcome.plan or plan, paths, outcome.code, time.perf_counter() - started, outcome.not_followed,
               outcome.cause)
    return outcome.code
