"""A `torch.distributed.launch` script from before `--use-env`: the launcher passed `--local_rank=N`, and
the script requires it and uses it for its device.

    python -m torch.distributed.launch --nproc_per_node=2 --nnodes=2 --node_rank=0 \
        --master_addr=node-a --master_port=29500 train_launch.py --lr 0.1
"""

import argparse

import torch.distributed as dist

from common import device_for, train_and_record

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, required=True)
parser.add_argument("--lr", type=float, default=0.01)
args = parser.parse_args()

device = device_for(args.local_rank)
dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", init_method="env://")
train_and_record("train_launch", args.local_rank, device, lr=args.lr)
dist.destroy_process_group()
