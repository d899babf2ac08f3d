"""Rank `fail_rank` raises at step `fail_step`; the others keep doing collectives (and would hang alone).
``message``: it raises ValueError(message) instead, a recipe's own error in its own words."""

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist


def main(ctx, cfg):
    Path(cfg.out_dir, f"pid{ctx.rank}").write_text(str(os.getpid()))
    for step in range(10_000):
        t = torch.ones(1)
        dist.all_reduce(t)
        if ctx.rank == cfg.fail_rank and step == cfg.fail_step:
            if cfg.get("message"):
                raise ValueError(cfg.message)
            raise RuntimeError(f"injected failure on rank {ctx.rank} at step {step}")
        time.sleep(0.01)
