"""The shape of PyTorch's ImageNet example: `--dist-url --world-size --rank --multiprocessing-distributed`;
with the last, it spawns one process per GPU itself and computes each one's rank.

    python imagenet_style.py --dist-url tcp://node-a:23456 --dist-backend nccl --multiprocessing-distributed \
        --world-size 2 --rank 0        # on node-a; --rank 1 on node-b

Started by the runner it is given `--dist-url env://` and no `--multiprocessing-distributed`: it then
takes the world size and its rank from the environment, as the example itself does.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from common import device_for, train_and_record

parser = argparse.ArgumentParser()
parser.add_argument("--dist-url", default="tcp://224.66.41.62:23456")
parser.add_argument("--dist-backend", default="nccl")
parser.add_argument("--world-size", type=int, default=-1)
parser.add_argument("--rank", type=int, default=-1)
parser.add_argument("--multiprocessing-distributed", action="store_true")
parser.add_argument("--gpu", type=int, default=None)


def main_worker(gpu, ngpus_per_node, args):
    if args.dist_url == "env://" and args.rank == -1:
        args.rank = int(os.environ["RANK"])
    if args.multiprocessing_distributed:
        args.rank = args.rank * ngpus_per_node + gpu  # the node's rank times its GPUs, plus this GPU
    local_rank = gpu if gpu is not None else int(os.environ.get("LOCAL_RANK", 0))
    dist.init_process_group(backend=args.dist_backend, init_method=args.dist_url, world_size=args.world_size,
                            rank=args.rank)
    train_and_record("imagenet_style", local_rank, device_for(local_rank), dist_url=args.dist_url)
    dist.destroy_process_group()


def main():
    args = parser.parse_args()
    if args.dist_url == "env://" and args.world_size == -1:
        args.world_size = int(os.environ["WORLD_SIZE"])
    ngpus_per_node = torch.cuda.device_count()
    if args.multiprocessing_distributed:
        args.world_size = ngpus_per_node * args.world_size
        mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))
    else:
        main_worker(args.gpu, ngpus_per_node, args)


if __name__ == "__main__":
    main()
