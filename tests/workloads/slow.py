"""A step of a little work and an all-reduce; rank `slow_rank` takes `extra_s` longer before each all-reduce."""

import time

import torch
import torch.distributed as dist


def main(ctx, cfg):
    t = torch.ones(1000)
    bar = ctx.progress(cfg.steps, "train")
    for _ in range(cfg.steps):
        x = torch.randn(100, 100)
        x = x @ x
        if ctx.rank == cfg.slow_rank:
            time.sleep(cfg.extra_s)
        dist.all_reduce(t)
        bar.update(samples=ctx.world_size)
    bar.close()
    return {"steps": cfg.steps}
