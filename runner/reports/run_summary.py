"""The end of a run on one screen, and the same facts in ``<run folder>/run_summary.json``.

`run` prints it to stderr once the launch returns (:func:`runner.app.launch.run_job`; stdout carries the
ranks' echo)::

    == run 20261122-081449-c18061: done in 6.2 s ==
      job       1 host x 2 processes · cpu · gloo · ddp · sharding=none · launcher=local · runner.recipes.digits:main
      status    done: every rank returned (exit 0)
      metrics   step 420: test_accuracy=0.9689 steps=420 optimizer_state_bytes=33704
      outputs   outputs/2026-11-22/08-14-49_c18061/
                logs/rank*.log (2) · metrics.jsonl · checkpoints/last.pt · spec.yaml · plan.json · launch.txt

Every fact comes from the plan, the exit status and the run folder (:class:`runner.records.paths.RunPaths`):
the status from the exit status (0 done, 2 refused, 128+n stopped by signal n, else failed, naming the
rank that failed first from the ranks' error files, :func:`runner.records.outcomes.first_failures`), the metrics
from the last row of metrics.jsonl. With launcher=manual each host's `run` prints (and writes) its own.
Nothing here imports torch: `run`'s own process never does.
"""

from __future__ import annotations

import json
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.common import exits
from runner.common.files import write_atomically
from runner.common.formatting import duration, error_line, number
from runner.environments import provenance
from runner.plan.processes import Plan
from runner.records.membership import changes
from runner.records.outcomes import RankOutcome, first_failures, outcomes
from runner.records.paths import RunPaths
from runner.records.watch_files import end_dumps, read_diagnosis
from runner.reports.hangs import straggler
from runner.reports.metrics import read_metrics
from runner.spec.schema import is_script, recipe_settings

WIDTH = 110  # the outputs line wraps here
MAX_METRICS = 8


@dataclass(frozen=True)
class RunSummary:
    """What one run did, as facts; :meth:`render` is the screen, :meth:`document` the JSON."""

    run_id: str
    status: str  # done, failed, stopped, refused, submitted
    status_text: str  # the status line, in words
    exit_code: int
    wall_time_s: float
    world_size: int
    processes_per_host: tuple[int, ...]
    hosts: tuple[str, ...]
    device: str
    backend: str
    parallel: str
    sharding: str
    launcher: str
    recipe: str
    root: Path
    first_failure: dict[str, Any] | None = None  # rank, host, exception of the rank that failed first
    signal: str | None = None  # stopped: the signal's name
    slurm_job_id: str | None = None
    metrics_step: int | None = None
    final_metrics: dict[str, float] = field(default_factory=dict)
    code: str | None = None  # the git state of the job's folder, in words (provenance.json has it all)
    hang: dict[str, Any] | None = None  # where the ranks were when a collective timed out or the job stalled
    straggler: str | None = None  # the rank the others waited for, in words
    ended: tuple[str, ...] = ()  # ranks whose work was over but which did not end, ended by their agent, in words
    membership: tuple[str, ...] = ()  # each change of the job's hosts (membership.jsonl), in words
    files: tuple[str, ...] = ()  # what the run folder holds, relative to it, grouped (logs/rank*.log (2), ...)
    paths: dict[str, Any] = field(default_factory=dict)  # the same, as absolute paths by kind

    @property
    def job(self) -> str:
        counts = self.processes_per_host
        n_hosts = len(counts)
        if len(set(counts)) <= 1:
            shape = f"{_count(n_hosts, 'host')} x {_count(counts[0] if counts else 0, 'process', 'processes')}"
        else:
            shape = f"{n_hosts} hosts ({'+'.join(map(str, counts))}) = {_count(self.world_size, 'process', 'processes')}"
        return " · ".join([shape, self.device, self.backend, self.parallel, f"sharding={self.sharding}",
                           f"launcher={self.launcher}", self.recipe])

    def headline(self) -> str:
        took = duration(self.wall_time_s)
        how = {"done": f"done in {took}", "submitted": f"submitted in {took}"}.get(self.status,
                                                                                   f"{self.status} after {took}")
        return f"== run {self.run_id}: {how} =="

    def render(self, cwd: Path | None = None) -> str:
        """The screen: at most a dozen lines. The run folder is shown relative to ``cwd`` when under it."""
        lines = [self.headline(), f"  job       {self.job}", f"  status    {self.status_text}"]
        if self.final_metrics:
            shown = " ".join(f"{k}={number(v)}" for k, v in list(self.final_metrics.items())[:MAX_METRICS])
            more = f" (+{len(self.final_metrics) - MAX_METRICS} more)" if len(self.final_metrics) > MAX_METRICS else ""
            at = f"step {self.metrics_step}: " if self.metrics_step is not None else ""
            lines.append(f"  metrics   {at}{shown}{more}")
        if self.code:
            lines.append(f"  code      {self.code}")
        if self.hang:
            lines.append(f"  hang      {_wrapped(self.hang['text'], 12)}")
        if self.straggler:
            lines.append(f"  slowest   {self.straggler}")
        for text in self.ended:
            lines.append(f"  ended     {_wrapped(text, 12)}")
        for text in self.membership:
            lines.append(f"  hosts     {_wrapped(text, 12)}")
        lines.append(f"  outputs   {_shown_path(self.root, cwd)}/")
        row = ""
        for item in self.files:
            if row and len(row) + 3 + len(item) > WIDTH - 12:
                lines.append(f"            {row}")
                row = ""
            row = f"{row} · {item}" if row else item
        if row:
            lines.append(f"            {row}")
        return "\n".join(lines)

    def document(self) -> dict[str, Any]:
        """The facts for other tools (run_summary.json)."""
        return {
            "run_id": self.run_id, "status": self.status, "status_text": self.status_text,
            "exit_code": self.exit_code, "wall_time_s": round(self.wall_time_s, 3),
            "world_size": self.world_size, "hosts": list(self.hosts), "processes_per_host": list(self.processes_per_host),
            "device": self.device, "backend": self.backend, "parallel": self.parallel, "sharding": self.sharding,
            "launcher": self.launcher, "recipe": self.recipe,
            "first_failure": self.first_failure, "signal": self.signal, "slurm_job_id": self.slurm_job_id,
            "code": self.code, "hang": self.hang, "straggler": self.straggler, "ended_by_agent": list(self.ended),
            "metrics_step": self.metrics_step, "final_metrics": self.final_metrics,
            "membership": list(self.membership), "paths": self.paths,
        }


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


def _code(paths: RunPaths) -> str | None:
    """The job's code in one line, from provenance.json: its commit, whether it was dirty, and the snapshot."""
    try:
        doc = json.loads(paths.provenance.read_text())
    except (OSError, ValueError):
        return None
    return provenance.code_line(doc)


def _wrapped(text: str, indent: int) -> str:
    """``text`` in lines of at most WIDTH, the ones after the first indented by ``indent``."""
    import textwrap

    return ("\n" + " " * indent).join(textwrap.wrap(text, WIDTH - indent)) or text


def _shown_path(path: Path, cwd: Path | None) -> str:
    path = path.absolute()
    if cwd is not None and path.is_relative_to(cwd.absolute()) and path != cwd.absolute():
        return str(path.relative_to(cwd.absolute()))
    return str(path)


def _status(plan: Plan, paths: RunPaths, code: int, not_followed: str | None,
            cause: str | None = None) -> tuple[str, str, dict | None, str | None]:
    """(status, its words, the first failure, the signal's name) from the exit status and the rank files.
    ``not_followed``: what the launch submitted and did not follow to its end ("Slurm job 12"); ``cause``: why the job
    failed where no rank's record can say it (launcher=ssh: a host was lost), named before the ranks' failures."""
    ranks = [r.global_rank for r in plan.records]
    n = len(ranks)
    rank_outcomes = outcomes(paths, ranks)
    done = sum(1 for r in rank_outcomes if r.done)
    if code == exits.OK:
        return _done_status(plan, rank_outcomes, not_followed)
    if code == exits.INVALID:
        return "refused", "refused (exit 2): the launch did not start the job; the error above says why", None, None
    if (signum := exits.signal_of(code)) is not None:
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        returned = f"; {done} of {n} rank(s) had returned" if done else ""
        return "stopped", f"stopped by {name} (exit {code}){returned}", None, name
    return _failed_status(plan, paths, code, cause)


def _done_status(plan: Plan, rank_outcomes: list, not_followed: str | None) -> tuple[str, str, None, None]:
    """The status of a job that exited 0 (:func:`_status`): done, stopped on request, or submitted."""
    spec = plan.job.spec
    n = len(rank_outcomes)
    done = sum(1 for r in rank_outcomes if r.done)
    if not_followed:
        # run_summary.json then says so too: nothing here knows how the job will end
        return ("submitted", f"submitted as {not_followed}, not followed: the scheduler's queue shows it "
                f"(`squeue`)", None, None)
    if done == n and any(r.returned_on_request for r in rank_outcomes):
        return ("stopped", "stopped on request (Slurm's time-limit signal, SIGTERM or the stop signal): every "
                "rank returned, asked to checkpoint (exit 0)", None, None)
    ended = sum(1 for r in rank_outcomes if r.ended_by_its_agent)
    if done == n and ended:
        return ("done", f"done: every rank finished its work; {ended} did not end by itself and was ended by its "
                f"host agent (exit 0)", None, None)
    if done == n:
        what = "preflight passed, every rank returned" if spec.preflight else "every rank returned"
        return "done", f"done: {what} (exit 0)", None, None
    if is_script(spec.recipe) and not (plan.rules.hosts_start_apart and len(plan.job.hosts) > 1):
        # a script may end its process itself (os._exit) before it could say it returned: its status says it
        return "done", "done: every rank exited with status 0 (exit 0)", None, None
    if plan.rules.hosts_start_apart and len(plan.job.hosts) > 1:
        return "done", f"done: this host's processes returned (exit 0); {done} of {n} rank(s) so far", None, None
    return "done", f"done (exit 0): {done} of {n} rank(s) left their done file", None, None


def _failed_status(plan: Plan, paths: RunPaths, code: int, cause: str | None) -> tuple[str, str, dict | None, None]:
    """The status of a job that failed (:func:`_status`): the first failure, as the records say it."""
    spec = plan.job.spec
    ranks = [r.global_rank for r in plan.records]
    errors = first_failures(paths, ranks)
    said = read_diagnosis(paths)
    if said is not None and said.get("kind") == "left":  # a rank left early; the others failed on its connection
        left = said.get("left") or [None]
        return "failed", f"failed (exit {code}): {said['text']}", {"rank": left[0], "host": None,
                                                                  "exception": "left early"}, None
    if cause is not None:
        return "failed", f"failed (exit {code}): {cause}", {"rank": None, "host": None, "exception": cause}, None
    if not errors and said is not None and said.get("kind") == "stall":  # said by a host agent: no rank could
        return "failed", f"failed (exit {code}): {said['text'].split('): ', 1)[0]})", None, None
    if not errors:
        if spec.preflight:
            why = "a preflight check failed; the host line above says which"
        elif not any(paths.rank(r).log.exists() for r in ranks):
            why = "no rank started; the error above says why"
        else:
            why = ("no rank recorded a Python exception (killed by a signal, or a crash in native code?); the "
                   "report above says more")
        return "failed", f"failed (exit {code}): {why}", None, None
    first = errors[0]
    exception = error_line(first.exception or "?").removeprefix("ScriptExit: ")
    others = f" ({len(errors) - 1} other rank(s) failed after it)" if len(errors) > 1 else ""
    failure = {"rank": first.rank, "host": first.host, "exception": exception}
    # killed by a signal (its host agent wrote the record), or a script's sys.exit: it ended; else it raised
    how = "ended:" if first.killed or first.exception.startswith("ScriptExit: ") else "raised"
    return ("failed", f"failed (exit {code}): rank {failure['rank']} on host {failure['host']} {how} {exception}{others}",
            failure, None)


def _files(plan: Plan, paths: RunPaths) -> tuple[tuple[str, ...], dict[str, Any]]:
    """What the run folder holds, for the screen (grouped, relative) and for the JSON (absolute, by kind)."""
    root = paths.root
    logs_shown, logs = paths.rank_files(lambda r: r.log)
    errors_shown, errors = paths.rank_files(lambda r: r.error)
    checkpoints = sorted(p for p in paths.checkpoints.rglob("*") if p.is_file()) if paths.checkpoints.is_dir() else []
    slurm_out = sorted(root.glob(paths.slurm_output("*").name))
    shown: list[str] = []
    if logs:
        shown.append(f"{logs_shown} ({len(logs)})")
    if errors:
        shown.append(f"{errors_shown} ({len(errors)})")
    if paths.metrics.exists():
        shown.append(paths.metrics.name)
    shown += [str(p.relative_to(root)) for p in checkpoints[:3]]
    if len(checkpoints) > 3:
        shown.append(f"{paths.checkpoints.name}/ (+{len(checkpoints) - 3} more)")
    shown += [p.name for p in slurm_out]
    shown += [p.name for p in (paths.spec, paths.plan, paths.launch, paths.sbatch_script, paths.provenance) if p.exists()]
    shown.append(paths.summary.name)
    by_kind = {
        "run_folder": str(root.absolute()),
        "logs": [str(p.absolute()) for p in logs],
        "error_files": [str(p.absolute()) for p in errors],
        "metrics": str(paths.metrics.absolute()) if paths.metrics.exists() else None,
        "checkpoints": [str(p.absolute()) for p in checkpoints],
        "spec": str(paths.spec.absolute()),
        "plan": str(paths.plan.absolute()),
        "launch": str(paths.launch.absolute()),
        "summary": str(paths.summary.absolute()),
    }
    if slurm_out:
        by_kind["slurm_output"] = [str(p.absolute()) for p in slurm_out]
    return tuple(shown), by_kind


def summarize(plan: Plan, paths: RunPaths, code: int, wall_time_s: float, not_followed: str | None = None,
              cause: str | None = None) -> RunSummary:
    """The summary of a run whose launch returned exit status ``code`` after ``wall_time_s`` (``cause``: see
    :func:`_status`)."""
    job, spec = plan.job, plan.job.spec
    id_file = paths.slurm_job_id
    slurm_job_id = id_file.read_text().strip() or None if id_file.exists() else None
    status, words, failure, sig = _status(plan, paths, code, not_followed, cause)
    if slurm_job_id and status != "submitted":
        words += f" · Slurm job {slurm_job_id}"
    recipe = recipe_settings(spec.recipe).target
    if is_script(spec.recipe):
        found = {key: spec.recipe.get(key) if isinstance(spec.recipe, dict) else getattr(spec.recipe, key, None)
                 for key in ("path", "module")}
        recipe = f"script {found['path']}" if found["path"] else f"script -m {found['module']}"
    metrics = read_metrics(paths)
    ranks = [r.global_rank for r in plan.records]
    slow = straggler(end_dumps(paths, ranks))
    shown, by_kind = _files(plan, paths)
    return RunSummary(
        run_id=paths.run_id, status=status, status_text=words, exit_code=code, wall_time_s=wall_time_s,
        world_size=plan.world_size, processes_per_host=plan.processes_per_host,
        hosts=tuple(h.label for h in job.hosts), device=job.device.value, backend=_backend(plan, paths),
        parallel=spec.parallel.mode.value, sharding=spec.sharding.mode.value, launcher=spec.launcher.kind,
        recipe=recipe, root=paths.root, first_failure=failure, signal=sig, slurm_job_id=slurm_job_id,
        metrics_step=metrics.step, final_metrics=metrics.final, code=_code(paths), hang=_hang(paths),
        straggler=slow.text() if slow else None, files=shown, paths=by_kind,
        ended=tuple(text for r in ranks if (text := RankOutcome(paths, r).ended_by_its_agent)),
        membership=tuple(change.line() for change in changes(paths)))


def _hang(paths: RunPaths) -> dict[str, Any] | None:
    """Where the ranks were when a collective timed out or the job stalled (not how an uneven end was said)."""
    said = read_diagnosis(paths)
    return said if said is not None and said.get("kind") != "left" else None


def _backend(plan: Plan, paths: RunPaths) -> str:
    """The backend the job's process group used: a script chooses its own (rank 0's joined file says which)."""
    spec = plan.job.spec
    chosen = RankOutcome(paths, 0).backend if not recipe_settings(spec.recipe).init_process_group else None
    return chosen or plan.job.backend.value


def write(summary: RunSummary, path: Path) -> None:
    """Atomically (the hosts of a manual run may share the folder)."""
    write_atomically(path, json.dumps(summary.document(), indent=2) + "\n")


def report_run(plan: Plan, paths: RunPaths, code: int, wall_time_s: float, not_followed: str | None = None,
           cause: str | None = None) -> RunSummary | None:
    """Print the summary to stderr and write run_summary.json; never changes the run's outcome (a
    summary that cannot be made says why in one line)."""
    try:
        summary = summarize(plan, paths, code, wall_time_s, not_followed, cause)
        write(summary, paths.summary)
    except (OSError, ValueError, KeyError) as e:
        print(f"\n(no run summary: {type(e).__name__}: {e})", file=sys.stderr, flush=True)
        return None
    sys.stdout.flush()
    print("\n" + summary.render(Path.cwd()), file=sys.stderr, flush=True)
    return summary
