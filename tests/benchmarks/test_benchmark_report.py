"""benchmarks/report.py: REPORT.md's tables are rewritten from the result files, and only the tables."""

from __future__ import annotations

import pytest

import importlib.util
import json

from conftest import REPO

pytestmark = pytest.mark.unit

spec = importlib.util.spec_from_file_location("benchmark_report", REPO / "benchmarks" / "report.py")
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)


def test_every_table_block_of_the_report_is_rewritten_from_the_results(tmp_path):
    copy = tmp_path / "REPORT.md"
    copy.write_text("# prose stays\n\n<!-- table:plan -->\nold figures\n<!-- end -->\n\nmore prose\n\n"
                    "<!-- table:throughput -->\n<!-- end -->\n")
    assert report.update(copy) == ["plan", "throughput"]
    text = copy.read_text()
    assert text.startswith("# prose stays\n") and "more prose" in text and "old figures" not in text
    plan = json.loads((REPO / "benchmarks" / "results" / "plan_scale.json").read_text())
    biggest = max(plan["rows"], key=lambda r: r["processes"])
    assert f"| {biggest['form']} | {biggest['hosts']:,} | {biggest['processes']:,} | {biggest['seconds']:.3f} |" in text
    launch = json.loads((REPO / "benchmarks" / "results" / "launch_speed.json").read_text())
    assert f"| 2 | {launch['throughput']['2']['median_steps_per_s']['run']:.1f} |" in text
    assert report.update(copy) == ["plan", "throughput"]  # idempotent: the markers stay


def test_the_committed_report_has_every_table_block():
    text = (REPO / "benchmarks" / "REPORT.md").read_text()
    assert [m["name"] for m in report._BLOCK.finditer(text)] == ["machine", "launch", "throughput", "diagnosis", "plan",
                                                                 "sharding"]
