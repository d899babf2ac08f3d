"""One job from a composed spec: validate, plan, write what the run is, then dry-run or launch, and say how
it ended (runner.reports.run_summary)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time
from pathlib import Path

from runner.app import snapshot
from runner.app.agent import LaunchAgent
from runner.app.snapshot import Snapshot, SnapshotError
from runner.common import exits
from runner.common.signals import handling
from runner.environments import provenance
from runner.environments.process import ProcessEnvironment
from runner.launchers import LAUNCHERS, check
from runner.launchers.base import Invocation, Launcher
from runner.launchers.slurm_array import ArrayMember
from runner.plan.processes import Plan, make_plan
from runner.plan.render import plan_table, verdict, write_plan
from runner.records.paths import RunPaths
from runner.reports.run_summary import report as report_run
from runner.reports.where import where_the_ranks_are
from runner.spec.document import spec_yaml
from runner.spec.job import Job
from runner.spec.pins import Pins, pinned
from runner.spec.probe import LocalProbe
from runner.spec.problems import Severity, errors, render_problems
from runner.spec.schema import InitMethod, JobConfig, ScriptRecipeConfig

def _run_command() -> str:
    """This `run` executable's absolute path (a venv's bin need not be on every host's PATH)."""
    argv0 = sys.argv[0]
    return os.path.abspath(argv0) if os.path.basename(argv0) == "run" and os.path.exists(argv0) else "run"


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


def run_job(spec: JobConfig, out: Path, run_id: str, overrides: tuple[str, ...], config_dir: str | None,
            environment: ProcessEnvironment, config_name: str | None = None, agent: LaunchAgent | None = None,
            defer_submit: bool = False) -> int | ArrayMember:
    """The job's exit status. ``environment``: what `run` read of its own (runner.environments.process);
    ``agent``: `run`'s launch agent, which tries the recipe target and starts this host's processes
    (runner.app.agent), if it has one; with ``defer_submit`` (a sweep on Slurm), a batch job is prepared but
    not submitted: its :class:`ArrayMember` is returned for the sweep's job array."""
    started = time.perf_counter()
    # the job's folder (runner.spec.targets), for every process on every host: validation reads it
    spec.workdir = os.path.abspath(spec.workdir or os.getcwd())
    job, problems = check(spec, LocalProbe(agent.target_problem) if agent else LocalProbe())
    if job is None:
        print(render_problems(problems), file=sys.stderr)
        n = len(errors(problems))
        print(f"\nthe spec has {n} error(s); nothing was started.", file=sys.stderr)
        return exits.INVALID
    launcher_class = LAUNCHERS[spec.launcher.kind]
    if launcher_class.hosts_start_apart and len(job.hosts) > 1 and spec.run_id is None and not spec.dry_run:
        print("error: run_id: several hosts must share one run id and port, but none is pinned; hint: run with "
              "dry_run=true and use the command it prints for each host", file=sys.stderr)
        return exits.INVALID
    paths = RunPaths(out, spec.run_id or run_id)
    if paths.spec.exists() and not spec.dry_run:  # outputs/runs/<run id>: the same run id is the same run
        print(f"notice: run_id={paths.run_id}: {paths.root}/ holds this run already; this launch continues it (a "
              f"recipe resumes from its checkpoint there)", file=sys.stderr)
    paths.make()
    try:
        copy = _snapshot(spec, launcher_class.snapshots_by_default(environment), paths)
    except SnapshotError as e:
        print(f"error: {e}\n\nnothing was started.", file=sys.stderr)
        return exits.INVALID
    # the one spec of the run, pinned before anything reads it: the plan and this host's processes take it,
    # spec.yaml (a scheduler's tasks) and the manual launch's commands (the other hosts) are written from it
    job = pinned(job, _pins_of(launcher_class, job, paths, copy))
    spec = job.spec
    plan = make_plan(job, launcher_class.plan_rules(job, paths), paths)
    invocation = Invocation(spec.launcher.python or sys.executable, os.getcwd(), overrides, config_dir,
                            config_name if config_name != "job" else None, _run_command())
    environment = environment.with_exported(launcher_class.exported_names(spec))
    launcher = launcher_class(plan, paths, invocation, environment, agent.run_host if agent else None)
    request = launcher.request()
    paths.provenance.write_text(json.dumps(
        provenance.record(paths.run_id, spec.workdir, [h.label for h in job.hosts],
                          str(copy.folder) if copy else None).document(), indent=1))
    paths.spec.write_text(spec_yaml(spec))
    write_plan(plan, paths.plan)
    paths.launch.write_text(request.materialize())
    for name, text in request.files.items():
        (paths.root / name).write_text(text)

    if spec.dry_run:
        print("== spec ==")
        print(spec_yaml(spec).rstrip())
        print("\n== verdict ==")
        print(verdict(plan))
        if problems:
            print(render_problems(problems))
        print("\n== plan ==")
        print(plan_table(plan))
        print(f"\n== launch ({spec.launcher.kind}) ==")
        print(request.materialize().rstrip())
        print(f"\ndry run: nothing was started. Spec, plan and commands are in {paths.root}/")
        return exits.OK
    if spec.init.method is InitMethod.file and not plan.rules.hosts_start_apart:
        # the launchers that start every host at once; hosts started by hand come one by one
        from runner.worker.rendezvous import RendezvousError, stale_rendezvous_file
        try:
            stale_rendezvous_file(paths.rendezvous_file(spec.init.dir))
        except RendezvousError as e:
            print(f"error: init: {e}", file=sys.stderr)
            return exits.INVALID
    shown = [p for p in problems if p.severity is Severity.warning]
    if shown:
        print(render_problems(shown), file=sys.stderr)
    if defer_submit and (member := launcher.array_member()) is not None:
        return member
    with handling((signal.SIGQUIT,), lambda _s, _f: where_the_ranks_are(plan, paths)):  # Ctrl-\ or kill -QUIT
        code = launcher.launch(request)
    # the run on one screen, and run_summary.json
    report_run(plan, paths, code, time.perf_counter() - started, launcher.not_followed, launcher.cause)
    return code
