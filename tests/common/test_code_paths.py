"""runner.common.code_paths: a frame of the runner's told from the user's, by file name (as Python names a frame's
file) and in a faulthandler dump's line."""

from __future__ import annotations

import os

import pytest

import runner.worker.rank
from runner.common.code_paths import RUNNER_DIR, WORKER_DIR, faulthandler_frame_of_worker, in_runner

pytestmark = pytest.mark.unit


def test_the_runners_files_are_in_it_and_a_users_are_not(tmp_path) -> None:
    assert in_runner(runner.worker.rank.__file__) and in_runner(str(RUNNER_DIR / "training" / "context.py"))
    assert not in_runner(str(tmp_path / "train.py")) and not in_runner(f"{RUNNER_DIR}_other{os.sep}x.py")
    assert not in_runner(os.__file__)


def test_a_dump_line_of_a_ranks_body_is_told_from_the_scripts() -> None:
    assert faulthandler_frame_of_worker(f'  File "{WORKER_DIR}{os.sep}rank.py", line 60 in rank_main')
    assert not faulthandler_frame_of_worker('  File "/home/u/proj/train.py", line 12 in main')
    assert not faulthandler_frame_of_worker(f'  File "{RUNNER_DIR}{os.sep}training{os.sep}context.py", line 1 in x')
