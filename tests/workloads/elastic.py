"""The cheapest job that shows what a lost host does: a tiny weight, one all-reduce a step, ``step_s`` seconds a
step (the job's pace, not a synchronisation), a checkpoint every ``every`` steps through ctx.save_checkpoint (``pad_mb``
MiB of padding in it: a copy that takes time to send), resumed through ctx.checkpoint_to_resume, and a stop request
honoured at the next checkpoint step (ctx.should_stop, asked at those steps only, as the digits recipe asks every
``recipe.stop_check_every`` steps: the agreement is an all-reduce, a third of what a step of this job costs).

Rank 0 says "resumed from <path>: step N" where it resumes, and appends a line to ``out_dir/steps.jsonl`` after each
step (``time.time()``; the bed's hosts share the clock): the step, the world size, the attempt and the step the
attempt resumed from, so that a test sees which group trained when, without sleeping. With ``hold_after`` and
``gate``, rank 0 holds after the first step it takes at or past that one (its checkpoint saved where it is a checkpoint
step), for at most ``hold_s`` (120), until the file ``gate`` exists (the others wait in the next all-reduce); with
``hold_world`` too, only in an attempt of that world size: a test changes the hosts' network between two saves, or
starts a host again, and then lets the job go on. With ``wedge_host``, the ranks on that host stop after
``wedge_after`` steps of every attempt, for at most ``hold_s``, as ranks on a wedged GPU do: they never enter the next
all-reduce, and the others wait in it.

No DDP and no torch.optim: each imports torch._dynamo in every rank (the DDP constructor, the first optimizer step:
about 0.9 CPU-s a rank, most of what this job costs), and a lost host shows the same with a plain all-reduce.
"""

import json
import time
from pathlib import Path

import torch
import torch.distributed as dist


def main(ctx, cfg):
    torch.manual_seed(0)
    weight = torch.zeros(16, 4)
    step = 0
    source = ctx.checkpoint_to_resume()
    if source is not None:
        saved = ctx.load_checkpoint(path=source)
        step, weight = saved["step"], saved["weight"]
        if ctx.is_main:
            print(f"resumed from {source}: step {step}", flush=True)
    resumed = step
    pad = torch.zeros(int(cfg.get("pad_mb", 0)) * 2**18)  # float32: 4 bytes each
    bar = ctx.progress(cfg.steps, "train", initial=step)  # the runner hears the attempt's first step from it
    out = Path(cfg.out_dir)
    hold_after = cfg.get("hold_after")
    holds = hold_after is not None and cfg.get("hold_world", ctx.world_size) == ctx.world_size and ctx.is_main
    wedged = cfg.get("wedge_host") == ctx.host
    while step < cfg.steps:
        if wedged and step - resumed >= int(cfg.get("wedge_after", 5)):
            held_until(out / "never", float(cfg.get("hold_s", 120.0)))  # (its agent kills it when the attempt ends)
        grad = torch.randn(16, 4)
        dist.all_reduce(grad)  # the step's one all-reduce, as a DDP model's would be
        weight -= 0.1 * grad / ctx.world_size
        step += 1
        bar.update(samples=8 * ctx.world_size)
        if ctx.is_main:
            with open(out / "steps.jsonl", "a") as f:
                f.write(json.dumps({"t": time.time(), "step": step, "world": ctx.world_size, "attempt": ctx.attempt,
                                    "resumed": resumed, "host": ctx.host}) + "\n")
        if step % cfg.every == 0 or step == cfg.steps:
            ctx.save_checkpoint({"step": step, "pad": pad, "weight": weight})
        if holds and step >= hold_after:
            held_until(Path(cfg.gate), float(cfg.get("hold_s", 120.0)))
            holds = False
        if step % cfg.every == 0 and ctx.should_stop():  # (the same step on every rank: the agreement matches)
            ctx.save_checkpoint({"step": step, "pad": pad, "weight": weight})
            if ctx.is_main:
                print(f"stop requested: checkpoint at step {step}", flush=True)
            return {"stopped": True, "steps": step}
        time.sleep(cfg.step_s)
    bar.close()
    return {"steps": step}


def held_until(gate: Path, deadline_s: float = 120.0) -> None:
    """Wait until ``gate`` exists (a test made it), or ``deadline_s`` passed: a test that never makes it fails on
    what the job did next, not by a job that never ends."""
    ends = time.monotonic() + deadline_s
    while not gate.exists() and time.monotonic() < ends:
        time.sleep(0.05)
