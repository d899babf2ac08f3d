"""Each rank all-reduces (rank + 1) and writes what it saw to <out_dir>/rank<r>.json (and its view of the job to
view<r>.json: workloads.view). With ``wrap``, the type ctx.wrap gives a model too (DDP's constructor imports
torch._dynamo: about 0.8 CPU-s a rank, which the other tests need not pay)."""

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from workloads import view

ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
       "TORCHELASTIC_RUN_ID", "OMP_NUM_THREADS")


def main(ctx, cfg):
    t = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(t)
    record = {
        "rank": ctx.rank, "local_rank": ctx.local_rank, "world_size": ctx.world_size, "sum": t.item(),
        "backend": dist.get_backend(), "device": str(ctx.device), "pid": os.getpid(),
        "per_process_batch": ctx.per_process_batch_size, "env": {k: os.environ.get(k) for k in ENV},
        "wrapped": type(ctx.wrap(torch.nn.Linear(2, 2))).__name__ if cfg.get("wrap") else None,
        "torch_threads": torch.get_num_threads(),
    }
    Path(cfg.out_dir, f"rank{ctx.rank}.json").write_text(json.dumps(record))
    view.write(ctx, cfg)
