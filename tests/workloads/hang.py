"""All-reduces in a loop; rank `hang_rank` sleeps (never arrives) at step `hang_step`, after writing the file
`marker` (if given) so that a test knows it got there."""

import time
from pathlib import Path

import torch
import torch.distributed as dist


def main(ctx, cfg):
    for step in range(1000):
        if ctx.rank == cfg.hang_rank and step == cfg.hang_step:
            if cfg.get("marker"):
                Path(cfg.marker).write_text(str(step))
            time.sleep(3600)
        t = torch.ones(1)
        dist.all_reduce(t)
