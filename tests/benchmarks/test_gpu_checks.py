"""benchmarks/gpu_checks.py and scripts/gpu_checks.sh: every `run` the checks start is a spec a one-GPU machine
accepts (the one the checks count on refused as they expect), the fresh-rank check reads CUDA's signs rightly,
REPORT.md's GPU section is written from the results file, and the script's run without CUDA skips every check, ends
0 and writes both."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, compose, load_module, validate
from runner.app.script_shorthand import script_overrides
from runner.spec.probe import FixedProbe
from runner.spec.schema import ShardingMode


report = load_module("benchmark_report", REPO / "benchmarks" / "report.py")
gpu_fresh = load_module("gpu_fresh", REPO / "benchmarks" / "workloads" / "gpu_fresh.py")


@pytest.fixture(scope="module")
def gpu_checks():
    """benchmarks/gpu_checks.py, imported as its script runs it: with benchmarks/ first on the path."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        yield load_module("gpu_checks", REPO / "benchmarks" / "gpu_checks.py")
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


class OneGpu(FixedProbe):
    """A machine with one GPU where the checks' workloads are. The throughput recipe's module is copied into the
    folder `run` starts in by its check: found there, without importing torch here."""

    def target_problem(self, target: str, workdir: str | None):
        return None if target == "gpu_transformer:main" else super().target_problem(target, workdir)


def _checked(argv: list[str]):
    spec = compose(*script_overrides(argv))
    scripts = frozenset(str(p) for p in (REPO / "benchmarks" / "workloads").glob("*.py"))
    return validate(spec, OneGpu(cuda_devices=1, paths=scripts))


@pytest.mark.unit
def test_every_run_the_gpu_checks_start_is_accepted_on_a_one_gpu_machine_but_the_one_they_expect_refused(
        gpu_checks) -> None:
    launches = gpu_checks.launches(1)
    refused = _checked(launches.pop("more gpus than there are"))
    assert [p.key for p in refused.errors] == ["topology.devices_per_node"], refused.rendered()
    assert len(launches) == 14
    for name, argv in launches.items():
        checked = _checked(argv)
        assert checked.valid and not checked.errors, f"{name}: run {' '.join(argv)}\n{checked.rendered()}"


@pytest.mark.unit
def test_the_sharding_modes_checked_are_every_mode_the_runner_offers_on_a_gpu(gpu_checks) -> None:
    offered = [m.value for m in ShardingMode
               if _checked(["device=cuda", "topology=1x1", f"sharding={m.value}"]).valid]
    assert sorted(gpu_checks.SHARDING) == sorted(offered)


@pytest.mark.unit
def test_the_cuda_driver_library_is_a_sign_of_cuda_and_the_runtime_that_importing_torch_maps_is_not() -> None:
    runtime = "7f..-7f.. r-xp 00000000 fd:01 123 /opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcudart.so.13"
    driver = "7f..-7f.. r-xp 00000000 fd:01 456 /usr/lib/x86_64-linux-gnu/libcuda.so.580.159.03"
    anonymous = "7f..-7f.. rw-p 00000000 00:00 0 "
    assert not gpu_fresh.driver_mapped([runtime, anonymous])
    assert gpu_fresh.driver_mapped([runtime, driver + "\n"])


def _record(rank: dict, *ancestors: dict) -> dict:
    return {"self": rank, "ancestors": [{"pid": 10 + i, **a} for i, a in enumerate(ancestors)]}


@pytest.mark.unit
def test_the_zygote_and_agent_are_judged_by_the_sign_the_rank_shows_in_itself() -> None:
    clean, uvm, lib = {"uvm": False, "libcuda": False}, {"uvm": True, "libcuda": True}, {"uvm": False, "libcuda": True}
    verdict = gpu_fresh.zygote_or_agent_initialised
    assert verdict(_record(uvm, lib, clean, uvm)) is None  # libcuda mapped without cuInit; `run` (third) not judged
    assert "/dev/nvidia-uvm open in the zygote or the agent" in verdict(_record(uvm, clean, uvm))
    assert "libcuda mapped in the zygote" in verdict(_record(lib, lib, clean))  # no uvm shows: libcuda is the sign
    assert "shows no sign of CUDA in itself" in verdict(_record(clean, clean, clean))


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
