"""A torchrun-style script that makes its own process group without a timeout and all-reduces in a loop;
rank --hang-rank sleeps (never arrives) at step --hang-step."""

import argparse
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--hang-rank", type=int, default=1)
parser.add_argument("--hang-step", type=int, default=3)
args = parser.parse_args()
dist.init_process_group("gloo")  # no timeout: the runner's init.timeout_s, not torch's 30 minutes
for step in range(1000):
    if dist.get_rank() == args.hang_rank and step == args.hang_step:
        time.sleep(3600)
    dist.all_reduce(torch.ones(1))
