"""A script that spawns its own processes with torch.multiprocessing, one per GPU of this host, given every
host's GPU count: `--gpus 8,2 --node-rank 0` on the host with 8 GPUs, `--node-rank 1` on the one with 2.

    python spawn_gpus.py --gpus 8,2 --node-rank 0 --master node-a:29500    # on node-a
    python spawn_gpus.py --gpus 8,2 --node-rank 1 --master node-a:29500    # on node-b

Started by the runner, the processes exist already: `worker` runs once per process, its local rank from
LOCAL_RANK; the spawning stays for when the script is run by hand.
"""

import argparse
import os

import torch.distributed as dist
import torch.multiprocessing as mp

from common import device_for, train_and_record


def worker(local_rank: int, args) -> None:
    if "RANK" in os.environ:  # started by a launcher: it says where this process is
        rank, world_size, init = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), "env://"
    else:
        gpus = [int(n) for n in args.gpus.split(",")]
        rank, world_size, init = sum(gpus[:args.node_rank]) + local_rank, sum(gpus), f"tcp://{args.master}"
    device = device_for(local_rank)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=init, rank=rank,
                            world_size=world_size)
    train_and_record("spawn_gpus", local_rank, device)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", default="1")
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--master", default="127.0.0.1:29500")
    args = parser.parse_args()
    if "LOCAL_RANK" in os.environ:
        worker(int(os.environ["LOCAL_RANK"]), args)
    else:
        mp.spawn(worker, nprocs=[int(n) for n in args.gpus.split(",")][args.node_rank], args=(args,))
