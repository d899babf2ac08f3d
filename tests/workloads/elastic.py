"""The cheapest job that shows what a lost host does: a tiny DDP model, one all-reduce a step, ``step_s`` seconds a
step (the job's pace, not a synchronisation), a checkpoint every ``every`` steps through ctx.save_checkpoint (``pad_mb``
MiB of padding in it: a copy that takes time to send), resumed through ctx.checkpoint_to_resume, and a stop request
honoured at every step (ctx.should_stop: the checkpoint, then return), as the digits recipe does.

Rank 0 says "resumed from <path>: step N" where it resumes, and appends a line to ``out_dir/steps.jsonl`` after each
step (``time.time()``; the bed's hosts share the clock): the step, the world size, the attempt and the step the
attempt resumed from, so that a test sees which group trained when, without sleeping.
"""

import json
import time
from pathlib import Path

import torch
from torch import nn


def main(ctx, cfg):
    torch.manual_seed(0)
    model, optimizer = ctx.setup(nn.Linear(16, 4), torch.optim.SGD, lr=0.1)
    step = 0
    source = ctx.checkpoint_to_resume()
    if source is not None:
        step = ctx.load_checkpoint(path=source, model=model, optimizer=optimizer)["step"]
        if ctx.is_main:
            print(f"resumed from {source}: step {step}", flush=True)
    resumed = step
    pad = torch.zeros(int(cfg.get("pad_mb", 0)) * 2**18)  # float32: 4 bytes each
    bar = ctx.progress(cfg.steps, "train", initial=step)  # the runner hears the attempt's first step from it
    out = Path(cfg.out_dir)
    while step < cfg.steps:
        optimizer.zero_grad()
        model(torch.randn(8, 16, device=ctx.device)).sum().backward()  # DDP's one all-reduce
        optimizer.step()
        step += 1
        bar.update(samples=8 * ctx.world_size)
        if ctx.is_main:
            with open(out / "steps.jsonl", "a") as f:
                f.write(json.dumps({"t": time.time(), "step": step, "world": ctx.world_size, "attempt": ctx.attempt,
                                    "resumed": resumed, "host": ctx.host}) + "\n")
        if step % cfg.every == 0 or step == cfg.steps:
            ctx.save_checkpoint({"step": step, "pad": pad}, model=model, optimizer=optimizer)
        if ctx.should_stop():
            ctx.save_checkpoint({"step": step, "pad": pad}, model=model, optimizer=optimizer)
            if ctx.is_main:
                print(f"stop requested: checkpoint at step {step}", flush=True)
            return {"stopped": True, "steps": step}
        time.sleep(cfg.step_s)
    bar.close()
    return {"steps": step}
