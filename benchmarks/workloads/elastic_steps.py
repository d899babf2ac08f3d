"""A torchrun-style script for benchmarks/lost_hosts.py: a tiny DDP model, one all-reduce a step, ``--step-s`` seconds
a step, a checkpoint every ``--every`` steps into ``--ckpt`` (a folder every host sees), from which it resumes (as an
elastic torchrun script must: torchrun restarts every worker of every host).

Rank 0 appends a line to ``OUT/steps.jsonl`` after each step: the time (time.time(); the bed's hosts share the clock),
the step, the world size and TORCHELASTIC_RESTART_COUNT, so that the harness sees when the next attempt took its
first step and at what world size, without sleeping.
"""

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--step-s", type=float, default=0.1)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt = Path(args.ckpt) / "last.pt"
    start = 0
    if ckpt.exists():
        state = torch.load(ckpt)
        model.module.load_state_dict(state["model"])
        start = state["step"]
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    for step in range(start + 1, args.steps + 1):
        opt.zero_grad()
        model(torch.randn(8, 32)).sum().backward()  # DDP's one all-reduce
        opt.step()
        if rank == 0:
            with open(Path(args.out) / "steps.jsonl", "a") as f:
                f.write(json.dumps({"t": time.time(), "step": step, "world": world, "attempt": attempt,
                                    "resumed": start}) + "\n")
            if step % args.every == 0:
                tmp = ckpt.with_suffix(".tmp")
                torch.save({"model": model.module.state_dict(), "step": step}, tmp)
                os.replace(tmp, ckpt)
        time.sleep(args.step_s)  # the job's pace, not a synchronisation
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
