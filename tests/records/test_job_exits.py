"""runner.records.job_exits: how a sweep's job ended, written into its run folder and read back, and when its status
says a signal to `run` stopped it."""

from __future__ import annotations

import signal

import pytest

from runner.records.job_exits import record_exit, recorded_exit, stopped_by_run
from runner.records.paths import RunPaths

pytestmark = pytest.mark.unit


def test_a_jobs_exit_is_written_into_its_folder_and_read_back(tmp_path) -> None:
    folder = tmp_path / "3"
    folder.mkdir()
    assert recorded_exit(folder) is None  # not run (or submitted and not followed)
    ended = record_exit(folder, 1)
    assert (ended.folder, ended.code) == (folder, 1) and recorded_exit(folder) == ended
    assert (folder / "exit_status").read_text() == "1\n"


def test_ctrl_c_and_sigterm_stop_and_the_stop_signal_stops_only_where_run_was_sent_it(tmp_path) -> None:
    assert stopped_by_run(tmp_path, 128 + signal.SIGINT) and stopped_by_run(tmp_path, 128 + signal.SIGTERM)
    assert not stopped_by_run(tmp_path, 128 + signal.SIGUSR1) and not stopped_by_run(tmp_path, 1)
    assert not stopped_by_run(tmp_path, None)
    RunPaths(tmp_path, tmp_path.name).user_stop.write_text("SIGUSR1 to `run`\n")
    assert stopped_by_run(tmp_path, 128 + signal.SIGUSR1) and not stopped_by_run(tmp_path, 1)
