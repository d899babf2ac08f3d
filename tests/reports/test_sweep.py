"""Sweeps: `run -m` runs each job with its own folder and ports, then writes the sweep's summary (CSV,
Markdown, scaling plot). The arithmetic is checked on made-up job folders; real sweeps: a failed job, Ctrl-C (the
summary of a real sweep that trains: tests/e2e/test_any_world_size.py, whose sweep over 1 to 5 processes it checks)."""

from __future__ import annotations

import csv
import json
import os
import signal
import sys
import uuid
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from runs import nothing_left, run, signal_when_ready

from runner.records.dumps import Collective, GroupRecord, RankDump
from runner.records.paths import RunPaths
from runner.records.watch_files import RankWatchFiles
from runner.app.sweep_outcome import SweepOutcome
from runner.records.job_exits import record_exit
from runner.reports.sweep import SweepSummary, markdown, plot, summarize


def _job(sweep: Path, num: int, overrides: list[str], world: int, throughput: float | None, accuracy: float,
         done: int | None = None, error: bool = False) -> None:
    folder = sweep / str(num)
    (folder / ".hydra").mkdir(parents=True)
    (folder / "logs").mkdir()
    OmegaConf.save(OmegaConf.create(overrides), folder / ".hydra" / "overrides.yaml")
    (folder / "spec.yaml").write_text("dry_run: false\n")
    (folder / "plan.json").write_text(json.dumps({"world_size": world}))
    rows = [{"step": 10, "time_s": 1.0, "samples_per_s": throughput}] if throughput else []
    rows.append({"step": 20, "time_s": 2.0, "final": True, "test_accuracy": accuracy, "steps": 20})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for r in range(world if done is None else done):
        (folder / "logs" / f"rank{r:05d}.done").touch()
    if error:
        (folder / "logs" / "rank00000.error.json").write_text("{}")


@pytest.mark.unit
def test_speedup_and_efficiency_are_against_the_smallest_world_size(tmp_path):
    _job(tmp_path, 0, ["topology=1x1", "run_id=x"], 1, 1000.0, 0.96)
    _job(tmp_path, 1, ["topology=1x2"], 2, 1800.0, 0.97)
    _job(tmp_path, 2, ["topology=1x4"], 4, 3000.0, 0.95)
    _job(tmp_path, 10, ["topology=1x8"], 8, None, 0.0, error=True)
    rows = summarize(tmp_path)
    assert [r.folder.name for r in rows] == ["0", "1", "2", "10"]  # job order, not text order
    assert [r.config for r in rows] == ["topology=1x1", "topology=1x2", "topology=1x4", "topology=1x8"]
    assert [r.speedup for r in rows[:3]] == [1.0, 1.8, 3.0]
    assert [r.efficiency for r in rows[:3]] == [1.0, 0.9, 0.75]
    assert [r.status for r in rows] == ["done", "done", "done", "failed"]
    assert rows[3].speedup is None and rows[1].final == {"test_accuracy": 0.97, "steps": 20}
    table = markdown(rows)
    assert "| 2 | topology=1x4 | 4 | done | 3000 |  | 3 | 0.75 |  | 20 | 0.95 |" in table  # no slowest rank
    assert table.startswith("speedup from throughput (samples/s)\n")  # nothing shared by every job


@pytest.mark.unit
def test_a_job_whose_ranks_waited_for_one_names_it(tmp_path):
    _job(tmp_path, 0, ["topology=1x2"], 2, 1000.0, 0.9)
    paths = RunPaths(tmp_path / "0", "0")
    for rank, late in ((0, 0.0), (1, 0.1)):  # rank 1 enters every collective 0.1 s after rank 0
        entries = tuple(Collective(k, "all_reduce", entered_s=100.0 + 0.2 * k + late) for k in range(1, 21))
        RankWatchFiles(paths, rank).write_dump(RankDump(rank, "node0", 200.0, "end", "flight recorder",
                                                   (GroupRecord("0", 20, 20, entries),)))
    (row,) = summarize(tmp_path)
    assert row.slowest == "rank 1 on node0 (2.00x)"  # it works 0.2 s between collectives, rank 0 0.1 s
    assert "| rank 1 on node0 (2.00x) |" in markdown([row])


def _series_sweep(sweep: Path) -> None:
    """topology x sharding, with throughput."""
    for n, (topology, world, sharding, throughput) in enumerate([("1x1", 1, "none", 1000.0), ("1x1", 1, "zero", 800.0),
                                                                  ("1x4", 4, "none", 3000.0), ("1x4", 4, "zero", 3200.0)]):
        _job(sweep, n, [f"topology={topology}", f"sharding={sharding}", "recipe.epochs=3"], world, throughput, 0.9)


def _one_world_size_sweep(sweep: Path) -> None:
    for n, (sharding, throughput) in enumerate([("none", 1000.0), ("zero", 900.0), ("fsdp", 700.0)]):
        _job(sweep, n, ["topology=1x2", f"sharding={sharding}"], 2, throughput, 0.95)


def _script_sweep(sweep: Path) -> None:
    """A torchrun-style script's sweep over 1, 2 and 4 processes, no samples/s, rank 0's training time set."""
    script = ["recipe=script", "recipe.path=train.py", "recipe.args=[--epochs,3]"]
    for n, (topology, world, took) in enumerate([("1x1", 1, 8.0), ("1x2", 2, 5.0), ("1x4", 4, 4.0)]):
        _job(sweep, n, [f"topology={topology}", *script], world, None, 0.9)
        logs = sweep / str(n) / "logs"
        (logs / "rank00000.joined").write_text("gloo")
        os.utime(logs / "rank00000.joined", (1000.0, 1000.0))
        os.utime(logs / "rank00000.done", (1000.0 + took, 1000.0 + took))


@pytest.mark.unit
def test_each_configuration_scales_against_its_own_smallest_world_size(tmp_path):
    """topology x sharding: one series per sharding mode, each with its own baseline (and plot line)."""
    _series_sweep(tmp_path)
    rows = summarize(tmp_path)
    assert [r.series for r in rows] == ["sharding=none", "sharding=zero"] * 2  # constant keys are not a series
    assert [r.speedup for r in rows] == [1.0, 1.0, 3.0, 4.0]
    assert [r.efficiency for r in rows] == [1.0, 1.0, 0.75, 1.0]


@pytest.mark.unit
def test_jobs_of_one_world_size_compare_against_the_first_job(tmp_path):
    _one_world_size_sweep(tmp_path)
    rows = summarize(tmp_path)
    assert [r.speedup for r in rows] == [1.0, 0.9, 0.7] and [r.efficiency for r in rows] == [1.0, 0.9, 0.7]


@pytest.mark.unit
def test_a_sweep_without_throughput_has_no_plot(tmp_path):
    _job(tmp_path, 0, ["topology=1x2"], 2, None, 0.9)
    rows = summarize(tmp_path)
    assert rows[0].speedup is None and not plot(rows, tmp_path / "none.png")  # (it returns before matplotlib)
    assert not (tmp_path / "none.png").exists()


def test_the_scaling_plot_draws_each_kind_of_sweep(tmp_path):
    """The plot itself (matplotlib renders it: not a unit test): a line per series, a bar per job where the world
    size is one, speedup from training time where no job reports samples/s; each a PNG."""
    for name, make in (("series", _series_sweep), ("bars", _one_world_size_sweep), ("by_time", _script_sweep)):
        make(tmp_path / name)
        png = tmp_path / f"{name}.png"
        assert plot(summarize(tmp_path / name), png), name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


@pytest.mark.unit
def test_a_script_sweep_shows_what_varies_and_scales_by_training_time(tmp_path):
    """A torchrun-style script reports no samples/s: speedup comes from each job's training time (rank 0's, from
    joining the process group to its end), and the constant `recipe=script recipe.path=... recipe.args=[...]` is
    shown once, not in every row."""
    _script_sweep(tmp_path)
    rows = summarize(tmp_path)
    assert [r.config for r in rows] == ["topology=1x1", "topology=1x2", "topology=1x4"]
    assert [r.train_s for r in rows] == [8.0, 5.0, 4.0]
    assert [r.speedup for r in rows] == [1.0, 1.6, 2.0] and [r.efficiency for r in rows] == [1.0, 0.8, 0.5]
    table = markdown(rows)
    assert table.startswith("every job: recipe=script recipe.path=train.py recipe.args=[--epochs,3]\n"
                            "speedup from training time (rank 0's")
    assert "| 1 | topology=1x2 | 2 | done |  | 5.00 | 1.6 | 0.8 |" in table


@pytest.mark.unit
def test_a_sweep_without_matplotlib_writes_its_tables_and_names_the_extra(tmp_path, monkeypatch, capsys):
    """matplotlib is the extra ``plots``: without it (its import made to fail) the summary is written all the same,
    and the end of the sweep says what the plot needs."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ModuleNotFoundError
    _job(tmp_path, 0, ["topology=1x1"], 1, 1000.0, 0.96)
    _job(tmp_path, 1, ["topology=1x2"], 2, 1800.0, 0.97)
    SweepSummary().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    assert (tmp_path / "summary.csv").exists() and (tmp_path / "summary.md").exists()
    assert not (tmp_path / "scaling.png").exists()
    out = capsys.readouterr().out
    assert ("notice: no scaling.png: a sweep's scaling plot needs matplotlib, which is not installed here (the extra "
            "torch-jobspec[plots]); hint: pip install 'torch-jobspec[plots]'\n") in out

@pytest.mark.unit
def test_a_job_the_stop_signal_found_not_started_reads_as_stopped_and_stops_the_sweep(tmp_path):
    """A Slurm sweep's job cancelled before it started because `run` was sent the stop signal: 128 + the signal,
    with the job's user-stop marker, is a stop (its row and `run`'s exit say the signal), not a failure; the same
    status without the marker is a failure. The second job, run here, is told first; the first, followed in a
    Slurm array, is read from its folder."""
    outcome = SweepOutcome()
    for num, marker in ((0, True), (1, False)):
        _job(tmp_path, num, [f"recipe.seed={num}"], 2, None, 0.0, done=0)
        folder = tmp_path / str(num)
        if marker:
            RunPaths(folder, folder.name).user_stop.write_text("SIGUSR1 to `run`\n")
        ended = record_exit(folder, 128 + signal.SIGUSR1)
        assert ended.stopped_by_run is marker
        if marker:
            outcome.deferred(folder)
        else:
            outcome.ended(ended)
    assert [r.status for r in summarize(tmp_path)] == ["stopped (SIGUSR1)", "failed (exit 138)"]
    assert outcome.stopped() == 138 and [e.code for e in outcome.exits()] == [138, 138]
    assert [e.folder.name for e in outcome.exits()] == ["1", "0"]


def test_a_failed_job_does_not_stop_the_sweep_and_the_sweep_says_so(tmp_path):
    """A global batch of 3 cannot give each of 4 processes a sample: the 1x4 job is refused, the 1x2 one runs."""
    done = run("-m", "topology=1x4,1x2", "recipe.global_batch_size=3", "recipe.epochs=1", cwd=tmp_path)
    assert done.code == 1, done.output
    assert "1 of 2 job(s) of the sweep failed" in done.stderr
    (summary,) = (tmp_path / "outputs" / "multirun").glob("*/*/summary.csv")
    with open(summary) as f:
        assert [r["status"] for r in csv.DictReader(f)] == ["invalid spec", "done"]


def test_ctrl_c_stops_the_whole_sweep_not_just_its_job(tmp_path):
    run_id = f"int{uuid.uuid4().hex[:8]}"
    done = signal_when_ready(["-m", "topology=1x1,1x2", "recipe.epochs=400", f"run_id={run_id}"], tmp_path,
                             signal.SIGINT, "outputs/multirun/*/*/0/metrics.jsonl", timeout=180)  # (epoch 5's
    # metrics: 60 s was once too short on a machine at half speed under the suite)
    out = done.output
    assert done.code == 130, out
    assert "the sweep was stopped (SIGINT) after 1 job(s)" in out
    (sweep,) = [p for p in (tmp_path / "outputs" / "multirun").glob("*/*") if (p / "summary.csv").exists()]
    assert not (sweep / "1").exists()  # the second job never started
    with open(sweep / "summary.csv") as f:
        assert [r["status"] for r in csv.DictReader(f)] == ["stopped (SIGINT)"]
    nothing_left(run_id)
    nothing_left(f"{run_id}-0")
