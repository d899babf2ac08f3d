"""Each rank all-reduces (rank + 1) and writes where it ran to <out_dir>/rank<r>.json: the Slurm node
name, its IPv4 addresses, the master it met, the sum, and the values of the variables ``env`` names (and its view of
the job to view<r>.json: workloads.view)."""

import json
import os
import socket
from pathlib import Path

import psutil
import torch
import torch.distributed as dist

from workloads import view


def main(ctx, cfg):
    t = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(t)
    addrs = sorted(a.address for nics in psutil.net_if_addrs().values() for a in nics
                   if a.family == socket.AF_INET and not a.address.startswith("127."))
    record = {"rank": ctx.rank, "local_rank": ctx.local_rank, "node_rank": ctx.node_rank,
              "world_size": ctx.world_size, "sum": t.item(), "node": os.environ.get("SLURMD_NODENAME"),
              "addrs": addrs, "master_addr": os.environ.get("MASTER_ADDR"), "pid": os.getpid(),
              "slurm_job": os.environ.get("SLURM_JOB_ID"), "restart": ctx.attempt,
              "env": {name: os.environ.get(name) for name in cfg.get("env", [])}}
    Path(cfg.out_dir, f"rank{ctx.rank}.json").write_text(json.dumps(record))
    view.write(ctx, cfg)
