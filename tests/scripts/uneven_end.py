"""A torchrun-style DDP script whose rank 0 returns after 5 steps while the others go on for 50: they then fail in
DDP's all-reduce on its closed connection (an uneven end: fewer batches on one rank)."""

import torch
import torch.distributed as dist
from torch import nn


def main() -> None:
    dist.init_process_group("gloo")
    model = nn.parallel.DistributedDataParallel(nn.Linear(8, 2))
    for _ in range(5 if dist.get_rank() == 0 else 50):
        model(torch.randn(4, 8)).sum().backward()
    if dist.get_rank() == 0:
        return  # without a word to the others
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
