"""What every example script does once it has its process group: a few steps of a tiny model under DDP,
then a record of where it ran (``artifacts/rank<r>.json``), so that a test can check every rank."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn


def train_and_record(script: str, local_rank: int, device: torch.device, **facts) -> None:
    torch.manual_seed(0)
    model = nn.Linear(8, 1).to(device)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for _ in range(3):
        x = torch.randn(4, 8, device=device)
        loss = ddp(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    total = torch.tensor([float(dist.get_rank() + 1)], device=device)
    dist.all_reduce(total)
    out = Path("artifacts")
    out.mkdir(exist_ok=True)
    record = {"script": script, "rank": dist.get_rank(), "world_size": dist.get_world_size(), "local_rank": local_rank,
              "sum": total.item(), "device": str(device), "weight": model.weight.detach().cpu().flatten().tolist(),
              "env_rank": os.environ.get("RANK"), **facts}
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(record))
    print(f"{script}: rank {dist.get_rank()} of {dist.get_world_size()} done on {device}")


def device_for(local_rank: int) -> torch.device:
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")
