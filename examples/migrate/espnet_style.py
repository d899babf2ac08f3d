"""The shape of ESPnet2's distributed options: `--ngpu`, `--multiprocessing_distributed`, `--dist_backend`,
`--dist_init_method`, `--dist_world_size`, `--dist_rank`, `--local_rank`. With `--dist_init_method env://`
the ones left unset come from the environment (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR/PORT).

    python -m espnet2.bin.launch --cmd 'run.pl' --ngpu 4 --num_nodes 2 -- \
        python espnet_style.py --ngpu 4 --multiprocessing_distributed true --dist_backend nccl ...
"""

import argparse
import os

import torch
import torch.distributed as dist

from common import device_for, train_and_record


def str2bool(value: str) -> bool:
    return value.lower() in ("true", "1", "yes")


parser = argparse.ArgumentParser()
parser.add_argument("--ngpu", type=int, default=0)
parser.add_argument("--multiprocessing_distributed", type=str2bool, default=False)
parser.add_argument("--dist_backend", default="nccl")
parser.add_argument("--dist_init_method", default="env://")
parser.add_argument("--dist_world_size", type=int, default=None)
parser.add_argument("--dist_rank", type=int, default=None)
parser.add_argument("--local_rank", type=int, default=None)
args = parser.parse_args()

if args.multiprocessing_distributed:
    raise SystemExit("this example spawns nothing itself: run it with --multiprocessing_distributed false")
if args.dist_init_method == "env://":  # ESPnet2's DistributedOption reads what is not given from here
    args.dist_world_size = args.dist_world_size or int(os.environ["WORLD_SIZE"])
    args.dist_rank = args.dist_rank if args.dist_rank is not None else int(os.environ["RANK"])
    args.local_rank = args.local_rank if args.local_rank is not None else int(os.environ["LOCAL_RANK"])
dist.init_process_group(backend=args.dist_backend, init_method=args.dist_init_method,
                        world_size=args.dist_world_size, rank=args.dist_rank)
device = device_for(args.local_rank) if args.ngpu > 0 else torch.device("cpu")
train_and_record("espnet_style", args.local_rank, device, ngpu=args.ngpu)
dist.destroy_process_group()
