"""benchmarks/gpu_checks.py and scripts/gpu_checks.sh: REPORT.md's GPU section is written from the results file, and
the script's run without CUDA skips every check, ends 0 and writes both."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

spec = importlib.util.spec_from_file_location("benchmark_report", REPO / "benchmarks" / "report.py")
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)

GPU_RUN = {"date": "2026-12-01 10:00 UTC", "command": "bash scripts/gpu_checks.sh", "cuda": True,
           "device": {"python": "3.12.3", "torch": "2.11.0+cu128", "cuda": "12.8", "cpus": 16, "gpus": 1,
                      "name": "NVIDIA H200", "driver": "570.1"},
           "checks": [{"check": "throughput", "status": "pass", "seconds": 40.0,
                       "figures": {"median_steps_per_s": {"run": 9.9, "hand-written loop": 10.0}, "ratio": 0.99,
                                   "target": 0.98}},
                      {"check": "launch", "status": "pass", "seconds": 30.0,
                       "figures": {"1": {"median_s": {"run --": 2.0, "torchrun --standalone": 4.0}, "ratio": 0.5}}},
                      {"check": "oom", "status": "fail", "seconds": 3.0, "why": "CheckFailed: exit 0\nmore"}]}


@pytest.mark.unit
def test_the_gpu_section_is_rendered_from_a_gpu_runs_results(tmp_path) -> None:
    path = tmp_path / "gpu_checks.json"
    path.write_text(json.dumps(GPU_RUN))
    text = report.gpu(path)
    assert text.startswith("measured 2026-12-01 10:00 UTC with `bash scripts/gpu_checks.sh`: 1 x NVIDIA H200, "
                           "driver 570.1, torch 2.11.0+cu128, CUDA 12.8")
    assert "| throughput | pass | 40.0 | run 9.90 steps/s vs hand-written 10.00: **0.990x** (target 0.98) |" in text
    assert "| launch | pass | 30.0 | 1 process(es): run 2.00 s vs torchrun 4.00 s = **0.50x** |" in text
    assert "| oom | fail | 3.0 | CheckFailed: exit 0 |" in text


@pytest.mark.unit
def test_without_a_gpu_run_the_section_says_none_is_recorded_and_the_command(tmp_path) -> None:
    assert report.gpu(tmp_path / "absent.json") == ("No GPU run is recorded yet. On a GPU machine: "
                                                   "`bash scripts/gpu_checks.sh`.\n")


def test_the_scripts_cpu_run_skips_every_check_and_writes_the_results_and_the_report(tmp_path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("the CPU run: this machine has CUDA")
    results, report_md = REPO / "benchmarks" / "results" / "gpu_checks.json", REPO / "benchmarks" / "REPORT.md"
    before = report_md.read_text(), results.read_text() if results.exists() else None
    try:
        done = subprocess.run(["bash", str(REPO / "scripts" / "gpu_checks.sh")], capture_output=True, text=True,
                              timeout=60, env={**os.environ, "PYTHON": sys.executable})
        assert done.returncode == 0, done.stdout + done.stderr
        data = json.loads(results.read_text())
        assert not data["cuda"] and len(data["checks"]) == 10
        assert {c["status"] for c in data["checks"]} == {"skipped: no CUDA"}
        assert done.stdout.count(": skipped: no CUDA\n") == 10
        assert "No GPU run is recorded yet" in report_md.read_text().split("<!-- table:gpu -->")[1]
    finally:
        report_md.write_text(before[0])
        results.write_text(before[1]) if before[1] is not None else results.unlink()
