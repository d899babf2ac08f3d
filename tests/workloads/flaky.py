"""Adam steps on a fixed regression problem with a checkpoint every `every` steps; rank `fail_rank`
raises at step `fail_step` in the first `fail_attempts` attempts. Resumes from the run's own last
checkpoint; the main rank writes the final weights to <out_dir>/final.pt and each attempt's first step
to <out_dir>/attempt<k>.json. With `step_s`, each step takes that long, every rank writes its pid to
<out_dir>/pid<rank>.<attempt> and rank 0 its step to <out_dir>/step (for a test that kills a rank mid-run).
With `warm_up`, a resumed attempt runs one forward and backward that it throws away before its first step, so that
DDP has rebuilt its gradient buckets before that step (as an uninterrupted run has after its first step)."""

import json
import os
import time
from pathlib import Path

import torch
from torch import nn


def main(ctx, cfg):
    torch.manual_seed(0)
    model, optimizer = ctx.setup(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)), torch.optim.Adam, lr=0.01)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64 * ctx.world_size, 8, generator=g)
    y = x.sum(1, keepdim=True).sin()
    mine = slice(ctx.rank * 64, (ctx.rank + 1) * 64)
    saved = ctx.load_checkpoint(model=model, optimizer=optimizer)
    step = saved["step"] if saved else 0
    if saved and cfg.get("warm_up", False):
        nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
        optimizer.zero_grad()
    if ctx.is_main:
        Path(cfg.out_dir, f"attempt{ctx.attempt}.json").write_text(json.dumps({"first_step": step}))
    pace = cfg.get("step_s", 0)
    if pace:
        Path(cfg.out_dir, f"pid{ctx.rank}.{ctx.attempt}").write_text(str(os.getpid()))
    while step < cfg.steps:
        if pace:
            time.sleep(pace)
            if ctx.is_main:
                Path(cfg.out_dir, "step.tmp").write_text(str(step))  # whole, for the test that reads it
                os.replace(Path(cfg.out_dir, "step.tmp"), Path(cfg.out_dir, "step"))
        if ctx.rank == cfg.fail_rank and step == cfg.fail_step and ctx.attempt < cfg.fail_attempts:
            raise RuntimeError(f"injected failure at step {step}, attempt {ctx.attempt}")
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
        optimizer.step()
        step += 1
        if step % cfg.every == 0:
            ctx.save_checkpoint({"step": step}, model=model, optimizer=optimizer)
    state = ctx.full_state(model)
    if ctx.is_main:
        torch.save(state["model"], Path(cfg.out_dir, "final.pt"))
