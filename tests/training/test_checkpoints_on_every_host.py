"""RunContext.save_checkpoint in a job that outlives its hosts (runner.spec.elastic): two real processes (gloo), each
its host's local rank 0 with a run folder of its own (hosts that share no folder), or both in one folder; the last
checkpoint is then on every host, so that losing host 0 loses no checkpoint. (The rest of the context:
test_context.py.)"""

from __future__ import annotations

import subprocess
import sys

import torch

from runner.training.copies import complete_copy

SAVE = """
import sys, torch, torch.distributed as dist
from pathlib import Path
from runner.spec.place import RankPlace
from runner.spec.schema import ParallelConfig, ShardingConfig
from runner.training.context import ContextSettings, RunContext
rank, folder, keep, shared = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "1", sys.argv[4] == "1"
world = int(sys.argv[5])  # 2: a host of one process each; 3: host 1 has two (ranks 1 and 2)
dist.init_process_group("gloo", init_method=f"file://{folder / 'rdzv'}", rank=rank, world_size=world)
node = min(rank, 1)
own = folder / ("shared" if shared else f"host{node}")
place = RankPlace(global_rank=rank, local_rank=rank - node, node_rank=node, world_size=world,
                  local_world_size=1 if node == 0 else world - 1, host=f"h{node}", device="cpu", device_ids=())
ctx = RunContext(ContextSettings(place=place, parallel=ParallelConfig(), sharding=ShardingConfig(), global_batch_size=8,
                                 seed=7, output_dir=own, metrics_file=own / "metrics.jsonl",
                                 checkpoint_dir=own / "checkpoints", keep_on_every_host=keep))
for step in (10, 20):
    ctx.save_checkpoint({"step": step, "w": torch.arange(5000) * step if rank == 0 else None})
state = ctx.load_checkpoint()
print(state["step"])
dist.destroy_process_group()
"""


def save_twice(folder, keep: bool, shared: bool = False, world: int = 2) -> list[str]:
    procs = [subprocess.Popen([sys.executable, "-c", SAVE, str(rank), str(folder), "1" if keep else "0",
                               "1" if shared else "0", str(world)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
             for rank in range(world)]
    said = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * world, said
    return [out.strip() for out, _ in said]


def test_each_host_keeps_rank_0s_last_checkpoint_where_folders_are_their_own(tmp_path) -> None:
    assert save_twice(tmp_path, keep=True) == ["20", "20"]
    zero, one = (torch.load(tmp_path / f"host{r}" / "checkpoints" / "last.pt") for r in (0, 1))
    assert zero["step"] == one["step"] == 20 and torch.equal(zero["w"], one["w"])
    assert torch.equal(one["w"], torch.arange(5000) * 20)


def test_a_host_of_two_processes_gets_its_copy_through_its_local_rank_0(tmp_path) -> None:
    """Ranks 1 and 2 on host 1: rank 1 receives and writes the copy (rank 2 takes no part in the sending), and the
    copy records rank 0's save."""
    assert save_twice(tmp_path, keep=True, world=3) == ["20", "20", "20"]
    one = tmp_path / "host1" / "checkpoints" / "last.pt"
    assert torch.equal(torch.load(one)["w"], torch.arange(5000) * 20)
    assert (complete_copy(one).seq, complete_copy(one).step) == (2, 20) == \
        (complete_copy(tmp_path / "host0" / "checkpoints" / "last.pt").seq, 20)


def test_without_it_only_rank_0s_host_has_the_checkpoint(tmp_path) -> None:
    assert save_twice(tmp_path, keep=False) == ["20", "20"]  # (loaded: sent by rank 0)
    assert (tmp_path / "host0" / "checkpoints" / "last.pt").exists()
    assert not (tmp_path / "host1" / "checkpoints").exists()


def test_hosts_that_share_the_folder_write_it_once(tmp_path) -> None:
    assert save_twice(tmp_path, keep=True, shared=True) == ["20", "20"]
    assert sorted(p.name for p in (tmp_path / "shared" / "checkpoints").iterdir()) == ["last.pt", "last.pt.commit"]
