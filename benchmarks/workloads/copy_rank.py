"""One rank of benchmarks/checkpoint_copies.py: join a 2-process gloo group (two "hosts" of one process, each with a
run folder of its own), save a checkpoint of MIB MiB through ``ctx.save_checkpoint`` once, and write how long the
save held the rank and how much its resident memory grew at the peak.

    python copy_rank.py RANK FOLDER MIB EVERY_HOST     (EVERY_HOST: 1, a job that outlives its hosts; 0, not)

With EVERY_HOST, rank 0 writes its file, then sends it in chunks to rank 1, which writes its own copy as the chunks
come (runner.training.copies); without, rank 0 writes its file alone and rank 1 waits at the save's barrier. The
state is float32 tensors of 64 MiB, made before the clock starts (rank 0's only). Linux: the peak is the kernel's
high-water mark of this process's resident set (VmHWM), reset just before the save.
"""

from __future__ import annotations

import datetime
import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from runner.spec.place import RankPlace
from runner.spec.schema import ParallelConfig, ShardingConfig
from runner.training.context import ContextSettings, RunContext

TENSOR_MIB = 64


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


def main() -> None:
    rank, folder, mib, every_host = int(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
    way = "copies" if every_host else "local"
    dist.init_process_group("gloo", init_method=f"file://{folder}/group-{way}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=900))
    mine = folder / way / f"host{rank}"
    place = RankPlace(global_rank=rank, local_rank=0, node_rank=rank, world_size=2, local_world_size=1,
                      host=f"host{rank}", device="cpu", device_ids=())
    ctx = RunContext(ContextSettings(place=place, parallel=ParallelConfig(), sharding=ShardingConfig(),
                                     global_batch_size=2, seed=0, output_dir=mine, metrics_file=mine / "metrics.jsonl",
                                     checkpoint_dir=mine / "checkpoints", keep_on_every_host=every_host))
    count = max(1, mib // TENSOR_MIB)
    state = {"step": 1, "model": {f"layer{i}.weight": torch.ones(mib * 2**20 // count // 4) for i in range(count)}} \
        if rank == 0 else None
    dist.barrier()
    Path("/proc/self/clear_refs").write_text("5")  # the peak from here on
    before = _status_kib("VmRSS")
    started = time.perf_counter()
    ctx.save_checkpoint(state)
    seconds = time.perf_counter() - started
    peak = _status_kib("VmHWM")
    written = mine / "checkpoints" / "last.pt"
    result = {"seconds": round(seconds, 3), "peak_growth_bytes": (peak - before) * 1024,
              "file_bytes": written.stat().st_size if written.exists() else None}
    (folder / f"{way}-rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
