"""One rank of benchmarks/checkpoint_broadcast.py: join a 2-process gloo group, get rank 0's checkpoint (this rank's
own folder has none, as on a host that does not share the run folder) one way, and write how much its resident
memory grew at the peak and how long it took.

    python checkpoint_rank.py RANK FOLDER WAY     (WAY: whole or chunked)

``whole``: the runner's way before, rank 0's file as one object through ``broadcast_object_list``; ``chunked``:
``ctx.load_checkpoint`` as the runner does it now (runner.training.checkpoints.broadcast_file). Linux: the peak is
the kernel's high-water mark of this process's resident set (VmHWM), reset just before the load.
"""

from __future__ import annotations

import datetime
import io
import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from runner.spec.place import RankPlace
from runner.spec.schema import ParallelConfig, ShardingConfig
from runner.training.context import ContextSettings, RunContext


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


def whole_object(rank: int, path: Path) -> dict:
    """The way before: every rank learns whether it sees rank 0's file, then gets its bytes as one pickled object."""
    stamps: list[object] = [None, None]
    dist.all_gather_object(stamps, path.stat().st_size if path.exists() else None)
    sent = [path.read_bytes() if rank == 0 else None]
    dist.broadcast_object_list(sent, src=0)
    return torch.load(io.BytesIO(sent[0]), map_location="cpu", weights_only=True)


def main() -> None:
    rank, folder, way = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo", init_method=f"file://{folder}/group-{way}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=600))
    mine = folder / f"host{rank}"
    place = RankPlace(global_rank=rank, local_rank=0, node_rank=rank, world_size=2, local_world_size=1,
                      host=f"host{rank}", device="cpu", device_ids=())
    ctx = RunContext(ContextSettings(place=place, parallel=ParallelConfig(), sharding=ShardingConfig(),
                                     global_batch_size=2, seed=0, output_dir=mine,
                                     metrics_file=mine / "metrics.jsonl", checkpoint_dir=mine / "checkpoints"))
    path = mine / "checkpoints" / "last.pt"
    dist.barrier()
    Path("/proc/self/clear_refs").write_text("5")  # the peak from here on
    before = _status_kib("VmRSS")
    started = time.perf_counter()
    state = whole_object(rank, path) if way == "whole" else ctx.load_checkpoint(path=path)
    seconds = time.perf_counter() - started
    peak = _status_kib("VmHWM")
    loaded = sum(t.numel() * t.element_size() for t in state["model"].values())
    dist.barrier()
    (folder / f"{way}-rank{rank}.json").write_text(json.dumps(
        {"peak_growth_bytes": (peak - before) * 1024, "seconds": seconds, "loaded_bytes": loaded}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
