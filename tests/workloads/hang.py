"""All-reduces in a loop; rank `hang_rank` sleeps (never arrives) at step `hang_step`."""

import time

import torch
import torch.distributed as dist


def main(ctx, cfg):
    for step in range(1000):
        if ctx.rank == cfg.hang_rank and step == cfg.hang_step:
            time.sleep(3600)
        t = torch.ones(1)
        dist.all_reduce(t)
