"""A torchrun-style DDP script whose rank --slow-rank sleeps before its backward at step --slow-step (a rank that
falls silent in the middle of training): the others wait in DDP's all-reduce until their timeout. Each rank
writes <--out>/ready<rank> once it has trained a step."""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--slow-rank", type=int, default=1)
parser.add_argument("--slow-step", type=int, default=5)
parser.add_argument("--out", required=True)
args = parser.parse_args()
dist.init_process_group("gloo")  # no timeout: the runner's init.timeout_s
rank = dist.get_rank()
model = nn.parallel.DistributedDataParallel(nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1000):
    loss = model(torch.randn(4, 8)).sum()
    if rank == args.slow_rank and step == args.slow_step:
        time.sleep(3600)
    loss.backward()
    opt.step()
    opt.zero_grad()
    if step == 1:
        open(os.path.join(args.out, f"ready{rank}"), "w").close()
