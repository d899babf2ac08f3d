"""runner.plan.paths: every path of a run's folder comes from one object, and the rendezvous files of each run and
attempt are fresh and private."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from runner.plan.paths import RunPaths

pytestmark = pytest.mark.unit


def test_every_file_of_a_run_is_under_its_folder() -> None:
    paths = RunPaths(Path("/runs/R1"), "R1")
    named = {"spec": "spec.yaml", "plan": "plan.json", "launch": "launch.txt", "sbatch_script": "job.sbatch",
             "user_stop": "user_stop", "provenance": "provenance.json", "code": "code", "logs": "logs",
             "metrics": "metrics.jsonl", "checkpoints": "checkpoints"}
    assert {name: getattr(paths, name) for name in named} == {name: Path("/runs/R1") / f for name, f in named.items()}
    assert paths.rank_log(12) == Path("/runs/R1/logs/rank00012.log")
    assert paths.elastic_error_file(3) == Path("/runs/R1/logs/rank00003.elastic-error.json")


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
