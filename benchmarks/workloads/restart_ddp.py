"""A torchrun-style script for benchmarks/restart_across_hosts.py: a tiny DDP model trained in a loop, one
all-reduce per step, ``--step-s`` seconds a step (the pace of a real job, so that it can be killed mid-run).

After each step it writes ``OUT/host<H>.<pid>.json`` (atomically): its pid, rank, TORCHELASTIC_RESTART_COUNT, step,
and the times (CLOCK_MONOTONIC, which every process of the machine shares, network namespaces included) when its
first and its latest step were done. H is RESTART_BENCH_HOST (the harness sets it on each host's launcher); a new
pid is a new attempt (torchrun's restart count is the host's own, not the job's). The harness waits on these files
instead of sleeping.
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
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--step-s", type=float, default=0.05)
    args = parser.parse_args()
    mark = Path(args.out) / f"host{os.environ['RESTART_BENCH_HOST']}.{os.getpid()}.json"
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    first = None
    for step in range(1, args.steps + 1):
        opt.zero_grad()
        model(torch.randn(8, 32)).sum().backward()  # DDP's one all-reduce
        opt.step()
        done = time.monotonic()
        first = first or done
        tmp = mark.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "rank": dist.get_rank(), "step": step, "first_t": first,
                                   "t": done, "restart_count": os.environ.get("TORCHELASTIC_RESTART_COUNT")}))
        os.replace(tmp, mark)
        time.sleep(args.step_s)  # the job's pace, not a synchronisation
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
