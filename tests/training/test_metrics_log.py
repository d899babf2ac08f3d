"""runner.training.metrics_log: rank 0's metrics.jsonl, one JSON line a row, opened on the first row only."""

from __future__ import annotations

import json

import pytest

from runner.training.metrics_log import MetricsLog

pytestmark = pytest.mark.unit


def test_rows_are_json_lines_with_the_step_and_the_time_since_the_log_was_made(tmp_path, capsys) -> None:
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path)
    assert not path.exists()  # nothing logged, no file
    log.write(1, {"loss": 0.5}, echo=False)
    log.write(2, {"loss": 0.25, "acc": 0.75}, echo=True)
    assert len(path.read_text().splitlines()) == 2  # line-buffered: in the file before it is closed
    log.close()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["step"], r["loss"]) for r in rows] == [(1, 0.5), (2, 0.25)] and rows[1]["acc"] == 0.75
    assert 0 <= rows[0]["time_s"] <= rows[1]["time_s"]
    assert capsys.readouterr().out == "step 2: loss=0.25 acc=0.75\n"


def test_a_log_appends_to_what_an_earlier_attempt_wrote(tmp_path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n')
    log = MetricsLog(path)
    log.write(2, {}, echo=False)
    log.close()
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]
