"""The result of a sweep (`run -m topology=1x1,1x2,1x4 ...`): one row per job, a CSV and a Markdown
table, and a plot of throughput and efficiency against world size, written into the sweep folder.

Each job's row comes from its run folder: the overrides that made it (.hydra/overrides.yaml; the table shows
those that differ between the jobs, the others once above it), its world size (plan.json), how its ranks ended
(logs/), its metrics (metrics.jsonl: the last ``samples_per_s`` is the throughput, the final row's other numbers
the final metrics) and its training time (rank 0's, from joining the process group to its end: logs/). Speedup
is throughput over that of the smallest world size in the sweep, or, where no job reports a throughput (a
torchrun-style script cannot), that job's training time over this one's (strong scaling: the same work at every
size); efficiency is speedup over the ratio of world sizes (1.0: linear scaling). Registered as a Hydra callback
in conf/job.yaml.
"""

from __future__ import annotations

import csv
import json
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from runner.common import exits
from runner.common.extras import PLOTS
from runner.common.formatting import number
from runner.records.job_exits import recorded_exit, stopped_by_run
from runner.records.outcomes import outcomes
from runner.records.paths import RunPaths, SweepPaths
from runner.records.watch_files import end_dumps
from runner.reports.hangs import straggler
from runner.reports.metrics import THROUGHPUT, read_metrics

@dataclass(kw_only=True)
class JobRow:
    folder: Path
    config: str  # the job's overrides, as typed
    world_size: int | None
    status: str  # done, failed (exit n), stopped (SIGINT), invalid spec, dry run, stopped, not run, submitted (slurm job n)
    throughput: float | None
    final: dict[str, Any] = field(default_factory=dict)
    speedup: float | None = None
    efficiency: float | None = None
    overrides: tuple[str, ...] = ()
    series: str = ""  # the overrides, other than the topology's, that differ between the sweep's jobs
    slowest: str = ""  # the rank the others waited for ("rank 3 (1.42x)"), if one was
    train_s: float | None = None  # rank 0's time from joining the process group to its end


def _status(folder: Path, world_size: int | None) -> str:
    paths = RunPaths(folder, folder.name)
    recorded = recorded_exit(folder)
    code = recorded.code if recorded is not None else None
    if not paths.spec.exists():
        return "invalid spec" if code == exits.INVALID else "not run"
    if stopped_by_run(folder, code):
        return f"stopped ({signal.Signals(exits.signal_of(code)).name})"
    if code not in (None, 0):
        return "invalid spec" if code == exits.INVALID else f"failed (exit {code})"
    spec = OmegaConf.load(paths.spec)
    if spec.get("dry_run"):
        return "dry run"
    if code is None and paths.slurm_job_id.exists():  # launcher.slurm.follow=false
        return f"submitted (slurm job {paths.slurm_job_id.read_text().strip()})"
    ranks = outcomes(paths, range(world_size or 0))
    if any(r.failed for r in ranks):
        return "failed"
    done = [r for r in ranks if r.done]
    if world_size and len(done) >= world_size:
        return "stopped on request" if any(r.returned_on_request for r in done) else "done"
    return "stopped" if done else "not run"


def job_row(folder: Path) -> JobRow:
    paths = RunPaths(folder, folder.name)
    overrides = OmegaConf.load(paths.hydra_overrides) if paths.hydra_overrides.exists() else []
    shown = tuple(str(o) for o in overrides if not str(o).startswith(("run_id=", "hydra.")))
    world = json.loads(paths.plan.read_text())["world_size"] if paths.plan.exists() else None
    metrics = read_metrics(paths)
    final = {k: v for k, v in metrics.final.items() if k != THROUGHPUT}  # throughput has its own column
    slow = straggler(end_dumps(paths, range(world or 0)))
    return JobRow(folder=folder, config=" ".join(shown), world_size=world, status=_status(folder, world),
                  throughput=metrics.throughput, final=final, overrides=shown,
                  slowest=f"rank {slow.rank} on {slow.host} ({slow.ratio:.2f}x)" if slow else "",
                  train_s=_train_time(paths))


def _train_time(paths: RunPaths) -> float | None:
    """Rank 0's time from joining the process group to its end (its done file), launch and imports left out."""
    rank0 = paths.rank(0)
    try:
        took = rank0.done.stat().st_mtime - rank0.joined.stat().st_mtime
    except OSError:
        return None
    return took if took > 0 else None


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def common_overrides(rows: list[JobRow]) -> tuple[str, ...]:
    """The overrides every job of the sweep has (shown once, not in every row)."""
    if not rows:
        return ()
    shared = set(rows[0].overrides).intersection(*(set(r.overrides) for r in rows[1:]))
    return tuple(o for o in rows[0].overrides if o in shared) if len(rows) > 1 else ()


def _label_series(rows: list[JobRow]) -> None:
    """A job's series: its overrides other than the topology's, those that differ between jobs (a sweep
    over topology x sharding has one series per sharding mode, each scaling over the topologies). Its
    configuration, as the table shows it: what differs between the jobs."""
    values: dict[str, set[str]] = {}
    for r in rows:
        for o in r.overrides:
            values.setdefault(_key(o), set()).add(o)
    varying = {k for k, v in values.items() if len(v) > 1 and not k.startswith("topology")}
    shared = set(common_overrides(rows))
    for r in rows:
        r.series = " ".join(o for o in r.overrides if _key(o) in varying)
        r.config = " ".join(o for o in r.overrides if o not in shared) or r.config


def scaling_basis(rows: list[JobRow]) -> str:
    """What speedup is computed from: ``throughput`` where the jobs report one, else ``training time``."""
    return "throughput" if any(r.throughput for r in rows) else "training time"


def summarize(sweep_dir: Path) -> list[JobRow]:
    """One row per job folder of the sweep (Hydra's numbered folders), in job order, with speedup and
    efficiency against the first job of the smallest world size of the same series (the same
    configuration but for its topology); when every job has the same world size, against the first job.
    Speedup is from throughput, or, where no job reports one, from training time (:func:`scaling_basis`)."""
    rows = [job_row(f) for f in SweepPaths(sweep_dir).job_folders()]
    _label_series(rows)
    by_time = scaling_basis(rows) == "training time"
    measured = [r for r in rows if r.world_size and (r.train_s if by_time else r.throughput)]
    one_size = len({r.world_size for r in measured}) == 1
    for r in measured:
        peers = measured if one_size else [p for p in measured if p.series == r.series]
        base = min(peers, key=lambda p: p.world_size)  # the first job of the smallest world size
        r.speedup = base.train_s / r.train_s if by_time else r.throughput / base.throughput
        r.efficiency = r.speedup / (r.world_size / base.world_size)
    return rows


def table(rows: list[JobRow]) -> tuple[list[str], list[list[str]]]:
    metrics = sorted({k for r in rows for k in r.final})
    header = ["job", "configuration", "world size", "status", "throughput (samples/s)", "training time (s)", "speedup",
              "efficiency", "slowest rank", *metrics]
    body = [[r.folder.name, r.config, number(r.world_size), r.status, number(r.throughput),
             f"{r.train_s:.2f}" if r.train_s else "", number(r.speedup), number(r.efficiency), r.slowest,
             *(number(r.final.get(m)) for m in metrics)] for r in rows]
    return header, body


def write_csv(rows: list[JobRow], path: Path) -> None:
    header, body = table(rows)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(body)


def markdown(rows: list[JobRow]) -> str:
    header, body = table(rows)
    shared = common_overrides(rows)
    lines = [f"every job: {' '.join(shared)}"] if shared else []
    lines.append("speedup from " + ("throughput (samples/s)" if scaling_basis(rows) == "throughput" else
                                    "training time (rank 0's, from joining the process group to its end: the jobs "
                                    "report no samples/s; strong scaling, the same work at every size)"))
    lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in body]
    return "\n".join(lines) + "\n"


def plot(rows: list[JobRow], path: Path) -> bool:
    """Throughput and efficiency against world size, one line per series; when every job has the same
    world size, throughput per job as bars; speedup instead of throughput where the jobs report none
    (:func:`scaling_basis`). False: no job has a speedup."""
    by_time = scaling_basis(rows) == "training time"
    points = [r for r in rows if r.world_size and r.speedup is not None]
    if not points:
        return False
    value = (lambda r: r.speedup) if by_time else (lambda r: r.throughput)
    what = "speedup (training time of the first job / this one's)" if by_time else "throughput (samples/s)"
    import logging

    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # not its font-cache notes on the terminal
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, left = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    if len({r.world_size for r in points}) == 1:
        labels = [f"{r.folder.name}: {r.series or r.config}" for r in points]
        bars = left.bar(range(len(points)), [value(r) for r in points], color="tab:blue")
        left.bar_label(bars, [f"{r.speedup:.2f}x" for r in points])
        left.set_xticks(range(len(points)), labels, rotation=20, ha="right", fontsize=8)
        left.set_ylabel(what)
        left.set_title(f"the sweep at world size {points[0].world_size} (speedup against job {points[0].folder.name})")
    else:
        from matplotlib.lines import Line2D

        right = left.twinx()
        series = list(dict.fromkeys(r.series for r in points))
        legend = []
        for i, name in enumerate(series):
            line = sorted((r for r in points if r.series == name), key=lambda r: r.world_size)
            color = f"C{i % 10}"
            worlds = [r.world_size for r in line]
            left.plot(worlds, [value(r) for r in line], "o-", color=color)
            base = line[0]
            left.plot(worlds, [value(base) * w / base.world_size for w in worlds], ":", color=color, alpha=0.4)
            right.plot(worlds, [r.efficiency for r in line], "s--", color=color, alpha=0.8)
            legend.append(Line2D([], [], color=color, marker="o", label=name or ("speedup" if by_time else "throughput")))
        legend += [Line2D([], [], color="gray", linestyle=":", label="linear scaling"),
                   Line2D([], [], color="gray", marker="s", linestyle="--", label="efficiency")]
        left.set_xlabel("world size (processes)")
        left.set_ylabel(f"{what}, solid")
        left.set_xticks(sorted({r.world_size for r in points}))
        right.set_ylabel("efficiency (speedup / world-size ratio), dashed")
        right.set_ylim(0, max(1.1, max(r.efficiency for r in points) * 1.1))
        # below the plot: the lines of either axis may pass anywhere inside it
        left.legend(handles=legend, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=min(4, len(legend)),
                    fontsize=8, frameon=False)
        left.set_title("scaling of the sweep")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def write_summary(sweep_dir: Path) -> list[JobRow]:
    """summary.csv, summary.md and, where matplotlib is installed (the extra ``plots``), scaling.png."""
    rows = summarize(sweep_dir)
    if not rows:
        return rows
    paths = SweepPaths(sweep_dir)
    write_csv(rows, paths.summary_csv)
    paths.summary_md.write_text(markdown(rows))
    if PLOTS.installed():
        plot(rows, paths.scaling_plot)
    return rows


class SweepSummary(Callback):
    """At the end of a multirun: the sweep's summary in its folder, and the table on the terminal."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        rows = write_summary(sweep_dir)
        if rows:
            paths = SweepPaths(sweep_dir)
            print(f"\n== sweep: {len(rows)} job(s) ==\n{markdown(rows)}")
            print(f"summary: {paths.summary_csv}, {paths.summary_md}"
                  + (f", {paths.scaling_plot}" if paths.scaling_plot.exists() else ""), flush=True)
            if not PLOTS.installed():
                print(f"notice: no {paths.scaling_plot.name}: {PLOTS.missing()}; hint: {PLOTS.install}", flush=True)
