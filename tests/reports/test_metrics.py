"""runner.reports.metrics: a run's final metrics, from metrics.jsonl and what rank 0's recipe returned."""

from __future__ import annotations

import json

import pytest

from runner.records.outcomes import RankOutcome
from runner.reports.metrics import read_metrics

pytestmark = pytest.mark.unit


def test_no_metrics(paths) -> None:
    got = read_metrics(paths)
    assert (got.step, got.final, got.throughput) == (None, {}, None)


def test_the_last_row_the_final_one_and_the_throughput(paths) -> None:
    rows = [{"step": 5, "time_s": 1.0, "loss": 0.5, "samples_per_s": 100.0},
            {"step": 9, "time_s": 2.0, "final": True, "acc": 0.9, "flag": True},
            {"step": 10, "time_s": 2.5, "loss": 0.1}]
    paths.metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = read_metrics(paths)
    assert (got.step, got.final, got.throughput) == (9, {"acc": 0.9}, 100.0)  # the row marked final wins


def test_what_the_recipe_returned_wins(paths) -> None:
    paths.metrics.write_text(json.dumps({"step": 3, "acc": 0.5}) + "\n")
    RankOutcome(paths, 0).mark_done(stopped=False, result={"acc": 0.75, "name": "text is not a metric"})
    assert read_metrics(paths).final == {"acc": 0.75}
