"""runner.app.sweep_outcome: the jobs of one `run -m`, those run here and those followed in a Slurm array, counted
for `run`'s own exit status. (With the sweep's summary: tests/reports/test_sweep.py.)"""

from __future__ import annotations

import signal

import pytest

from runner.app.sweep_outcome import SweepOutcome
from runner.records.job_exits import record_exit

pytestmark = pytest.mark.unit


def test_jobs_run_here_come_first_and_a_stop_is_the_first_stopped_jobs_status(tmp_path) -> None:
    folders = [tmp_path / str(n) for n in range(4)]
    for f in folders:
        f.mkdir()
    outcome = SweepOutcome()
    outcome.deferred(folders[0])  # followed in an array: its status is in its folder once it ended
    outcome.ended(record_exit(folders[1], 0))
    outcome.deferred(folders[2])  # never ended (not followed): not counted
    assert [(e.folder.name, e.code) for e in outcome.exits()] == [("1", 0)] and outcome.stopped() is None
    record_exit(folders[0], 1)
    outcome.ended(record_exit(folders[3], 128 + signal.SIGINT))
    assert [(e.folder.name, e.code) for e in outcome.exits()] == [("1", 0), ("3", 130), ("0", 1)]
    assert outcome.stopped() == 130
