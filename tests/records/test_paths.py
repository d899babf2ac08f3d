"""runner.records.paths: the one object that names every file of a run's folder (a rank's, a sweep's), and the list
of them the table of docs/run-folder.md shows."""

from __future__ import annotations

import ast
import os
import re
import stat
from pathlib import Path

import pytest

from conftest import REPO
from sources import nodes
from runner.records.paths import RankPaths, RunPaths, SweepPaths

pytestmark = pytest.mark.unit


def test_every_file_a_run_folder_may_hold_is_listed_once() -> None:
    listed = [e.path for e in RunPaths.entries()]
    assert listed == [
        "spec.yaml", "plan.json", "launch.txt", "provenance.json", "code/", ".hydra/", ".hydra/overrides.yaml",
        "run.log", "job.sbatch", "step.sh", "slurm-<job id>.out", "slurm_job_id", "hostfile.<job id>", "spec.round<N>.yaml",
        "rounds.beat", "user_stop",
        "logs/", "logs/diagnose.request", "logs/diagnosis.json", "logs/hangs.jsonl", "metrics.jsonl", "membership.jsonl",
        "checkpoints/", "checkpoints/<name>.pt", "checkpoints/<name>.pt.commit",
        "run_summary.json", "exit_status", "<run id>.rdzv/", "<run id>.job/",
        "logs/rankNNNNN.log", "logs/rankNNNNN.error.json", "logs/rankNNNNN.elastic-error.json",
        "logs/rankNNNNN.joined", "logs/rankNNNNN.done", "logs/rankNNNNN.collectives.json", "logs/rankNNNNN.beat"]
    assert all(e.per_rank == e.path.startswith("logs/rankNNNNN.") for e in RunPaths.entries())
    assert all(e.what and "\n" not in e.what for e in RunPaths.entries())  # one line each, from the docstrings
    assert [e.path for e in SweepPaths.entries()] == ["summary.csv", "summary.md", "scaling.png", "array<k>.sbatch",
                                                      "slurm-<array id>_<n>.out"]


def test_every_accessor_that_names_a_path_is_in_the_list() -> None:
    """A property added without its mark would name a file docs/run-folder.md's table never shows."""
    for cls in (RunPaths, RankPaths, SweepPaths):
        unlisted = [name for name, member in vars(cls).items() if isinstance(member, property)
                    and type(member) is property and name != "files"]
        assert unlisted == [], (cls.__name__, unlisted)


def test_the_ranks_temp_folder_is_short_the_attempts_own_and_not_in_the_run_folder(tmp_path) -> None:
    """A Unix socket's path must fit in 107 bytes: multiprocessing's listener under a DataLoader's worker, in a run
    folder 70 characters deep, did not (the workers hung); the ranks' TMPDIR is short, in this machine's temp folder."""
    deep = tmp_path / ("x" * 120)
    first, second = RunPaths(deep, "R1").scratch(3), RunPaths(deep, "R1", attempt=1).scratch(3)
    assert len({first, second, RunPaths(deep, "R1").scratch(4)}) == 3 and first.parent == second.parent
    assert not first.is_relative_to(deep) and len(str(first)) <= len(str(first.parent)) + 24
    assert RunPaths(deep, "R1").scratch(3) == first and RunPaths(tmp_path / "other", "R1").scratch(3) != first


def test_a_ranks_files() -> None:
    paths = RunPaths(Path("/runs/R1"), "R1")
    rank = paths.rank(3)
    assert (rank.log, rank.error, rank.done, rank.joined) == tuple(
        Path("/runs/R1/logs") / f"rank00003.{kind}" for kind in ("log", "error.json", "done", "joined"))
    assert (rank.dump.name, rank.beat.name, rank.elastic_error.name) == (
        "rank00003.collectives.json", "rank00003.beat", "rank00003.elastic-error.json")
    assert paths.rank(123456).log.name == "rank123456.log"  # more than five digits: all of them


def test_every_ranks_file_of_one_kind(tmp_path) -> None:
    paths = RunPaths(tmp_path, "R1")
    assert paths.rank_files(lambda r: r.log) == ("logs/rank*.log", [])
    paths.make()
    for r in (10, 2, 0):
        paths.rank(r).log.touch()
    paths.rank(2).error.touch()
    assert paths.rank_files(lambda r: r.log) == ("logs/rank*.log", [paths.rank(r).log for r in (0, 2, 10)])
    assert paths.rank_files(lambda r: r.error) == ("logs/rank*.error.json", [paths.rank(2).error])


def test_paths_as_a_batch_script_names_them() -> None:
    paths = RunPaths(Path("/runs/my run"), "R1")
    assert paths.hostfile_in_batch_script() == "'/runs/my run/hostfile.'$SLURM_JOB_ID"
    assert paths.hostfile("12") == Path("/runs/my run/hostfile.12")
    inside = paths.in_shell_variable("folder")
    assert (str(inside.sbatch_script), str(inside.slurm_output("${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"))) == (
        "$folder/job.sbatch", "$folder/slurm-${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}.out")
    assert str(paths.slurm_output("%j")) == "/runs/my run/slurm-%j.out"


def test_the_rendezvous_and_the_channel_are_in_init_dir_or_the_run_folder() -> None:
    paths = RunPaths(Path("/runs/R1"), "R1", attempt=2)
    assert paths.rendezvous_file(None) == Path("/runs/R1/R1.rdzv/attempt2")
    assert paths.rendezvous_file("/shared") == Path("/shared/R1.rdzv/attempt2")
    assert (paths.channel_folder(None), paths.channel_folder("/shared")) == (Path("/runs/R1/R1.job"),
                                                                            Path("/shared/R1.job"))


def test_a_sweeps_jobs_in_job_order(tmp_path) -> None:
    for n in (10, 2, 0):
        RunPaths(tmp_path / str(n), str(n)).hydra.mkdir(parents=True)
        RunPaths(tmp_path / str(n), str(n)).hydra_overrides.write_text("[]\n")
    (tmp_path / "3").mkdir()  # not a job Hydra composed
    sweep = SweepPaths(tmp_path)
    assert sweep.job_folders() == [tmp_path / "0", tmp_path / "2", tmp_path / "10"]
    assert (sweep.array_script(1).name, sweep.array_output("%A", "%a").name) == ("array1.sbatch", "slurm-%A_%a.out")


def _string_constants(path: Path) -> list[tuple[int, str]]:
    """The string literals of a module (f-strings' literal parts too), its docstrings and dicts' keys (a JSON
    document's: run_summary.json's "slurm_job_id") left out."""
    walked = nodes(path)
    docstrings = {id(node.body[0].value) for node in walked
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    left_out = docstrings | {id(key) for node in walked if isinstance(node, ast.Dict) for key in node.keys}
    return [(node.lineno, node.value) for node in walked if isinstance(node, ast.Constant)
            and isinstance(node.value, str) and id(node) not in left_out]


# file names the runner's messages may mention to a person (the object still names the files themselves)
_SAID = {"spec.yaml", "launch.txt", "plan.json", "provenance.json"}


def test_nothing_else_in_the_runner_spells_a_file_name_of_the_run_folder() -> None:
    names = set()
    for e in (*RunPaths.entries(), *SweepPaths.entries()):
        names |= {part for part in re.split(r"<[^>]*>|NNNNN|/", e.path) if len(part) > 5 and ("." in part or "_" in part)}
    found = [f"{path.relative_to(REPO)}:{line}: {text!r}"
             for path in sorted((REPO / "runner").rglob("*.py")) if path.name != "paths.py"
             for line, text in _string_constants(path) for name in names - _SAID if name in text]
    assert found == []


def test_rendezvous_files_are_the_run_and_attempts_own() -> None:
    first, again = RunPaths(Path("/runs/R1"), "R1"), RunPaths(Path("/runs/R1"), "R1", attempt=2)
    assert first.rendezvous_file(None) == Path("/runs/R1/R1.rdzv/attempt0")
    assert again.rendezvous_file("/shared") == Path("/shared/R1.rdzv/attempt2")
    assert (first.channel_folder(None), again.channel_folder("/shared")) == (Path("/runs/R1/R1.job"),
                                                                            Path("/shared/R1.job"))


def test_a_private_folder_is_the_users_alone_whatever_the_umask(tmp_path) -> None:
    old = os.umask(0)
    try:
        RunPaths.make_private(tmp_path / "R1.rdzv")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "R1.rdzv").stat().st_mode) == 0o700
    (tmp_path / "R1.rdzv").chmod(0o750)  # made by another host of the run already: left as it is
    RunPaths.make_private(tmp_path / "R1.rdzv")
    assert stat.S_IMODE((tmp_path / "R1.rdzv").stat().st_mode) == 0o750


def test_make_creates_the_folder_and_its_logs(tmp_path) -> None:
    paths = RunPaths(tmp_path / "outputs" / "day" / "R1", "R1")
    paths.make()
    paths.make()  # again: nothing to do
    assert paths.logs.is_dir() and sorted(p.name for p in paths.root.iterdir()) == ["logs"]
