"""Steps with a progress bar: each rank reports loss 100 + its rank (so a line names its rank), and rank 0
prints a line halfway (output written while the bar is shown); ``step_s``: a pause after each step. Logs one metrics row at the end."""

import time

import torch
import torch.distributed as dist


def main(ctx, cfg):
    with ctx.progress(cfg.steps, "work", interval_s=cfg.get("interval_s", 1e9)) as bar:
        for step in range(cfg.steps):
            t = torch.ones(1)
            dist.all_reduce(t)
            if ctx.is_main and step == cfg.steps // 2:
                print(f"halfway: step {step}", flush=True)
            bar.update(loss=100.0 + ctx.rank, samples=cfg.global_batch_size)
            time.sleep(cfg.get("step_s", 0))  # steps that take time: the bar is redrawn while they run
    ctx.log(cfg.steps, echo=False, world=float(t.item()), final=True)
