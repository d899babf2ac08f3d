"""A torchrun-era script: everything from the environment torchrun sets (RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT). Also what `torch.distributed.launch --use-env` starts.

    torchrun --nproc-per-node 4 train_torchrun.py --epochs 3
"""

import argparse
import os

import torch.distributed as dist

from common import device_for, train_and_record

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
args = parser.parse_args()

local_rank = int(os.environ["LOCAL_RANK"])
device = device_for(local_rank)
dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
train_and_record("train_torchrun", local_rank, device, epochs=args.epochs)
dist.destroy_process_group()
