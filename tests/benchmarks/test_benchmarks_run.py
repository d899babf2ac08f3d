"""The benchmarks start: each imports what it needs (a renamed runner function fails here, not on the day someone
runs them), and the planning benchmark, which takes seconds, runs for real."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from conftest import REPO


@pytest.mark.parametrize("script", sorted(p.name for p in (REPO / "benchmarks").glob("*.py")
                                          if p.name not in ("report.py", "result_file.py", "namespace_bed.py", "sessions.py")))
def test_every_benchmark_starts(script):
    """Each benchmark imports what it needs and parses its options (a renamed runner function fails here, not on the
    day someone runs the benchmarks)."""
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), "--help"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("usage:"), done.stderr


def test_the_plan_benchmark_plans_its_smallest_size(tmp_path):
    """The planning benchmark runs in seconds: it is run for real, one repeat, into a scratch file. Whether it meets
    its budget is the benchmark's verdict, not this test's (the suite shares 2 cores with other tests): its exit
    status is the verdict it prints."""
    out = tmp_path / "plan_scale.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "plan_scale.py"), "--repeat", "1", "--output",
                           str(out)], capture_output=True, text=True, timeout=120)
    verdict = re.search(r"^(PASS|FAIL): ", done.stdout, re.MULTILINE)
    assert verdict is not None and done.returncode == {"PASS": 0, "FAIL": 1}[verdict.group(1)], done.stdout + done.stderr
    rows = json.loads(out.read_text())["rows"]
    assert {r["processes"] for r in rows} >= {8_000, 80_000}
