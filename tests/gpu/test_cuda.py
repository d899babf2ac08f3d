"""The GPU path's own facts, on a CUDA machine (marked gpu; skipped without CUDA): ranks placed on their GPU, NCCL's
all-reduce at world size 1, and a rank's CUDA generator a fresh process's."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from conftest import REPO, load_module

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")]
RUN = [sys.executable, "-c", "import sys; sys.argv[0] = 'run'; from runner.app.start import main; main()"]


def _run(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([*RUN, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_a_rank_of_a_cuda_job_sees_its_gpu_and_its_context_places_tensors_there(tmp_path) -> None:
    script = tmp_path / "where.py"
    script.write_text("import json, os, sys, torch, torch.distributed as dist\n"
                      "dist.init_process_group('nccl')\n"
                      "t = torch.ones(1, device='cuda')\n"
                      "dist.all_reduce(t)\n"
                      "json.dump({'visible': os.environ.get('CUDA_VISIBLE_DEVICES'), 'device': str(t.device),\n"
                      "           'sum': t.item(), 'backend': dist.get_backend()}, open(sys.argv[1], 'w'))\n"
                      "dist.destroy_process_group()\n")
    done = _run("device=cuda", "backend=nccl", "topology=1x1", "--", str(script), str(tmp_path / "out.json"),
                cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads((tmp_path / "out.json").read_text())
    assert record == {"visible": "0", "device": "cuda:0", "sum": 1.0, "backend": "nccl"}


def test_nccl_all_reduce_of_one_rank_in_process(tmp_path) -> None:
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=torch.device("cuda", 0))
    try:
        t = torch.arange(4, dtype=torch.float32, device="cuda")
        dist.all_reduce(t)
        assert t.device.type == "cuda" and t.tolist() == [0.0, 1.0, 2.0, 3.0]
    finally:
        dist.destroy_process_group()


def test_a_ranks_cuda_generator_is_a_fresh_processs(tmp_path) -> None:
    workload = REPO / "benchmarks" / "workloads" / "gpu_fresh.py"
    done = _run("device=cuda", "topology=1x1", "--", str(workload), str(tmp_path / "rank.json"), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    rank = json.loads((tmp_path / "rank.json").read_text())
    fresh = json.loads(subprocess.run([sys.executable, str(workload), "--fresh"], capture_output=True, text=True,
                                      check=True, timeout=60).stdout)
    assert {k: rank[k] for k in fresh} == fresh
    assert load_module("gpu_fresh", workload).zygote_or_agent_initialised(rank) is None
