"""An ordinary torchrun-style DDP script on CUDA with NCCL: 20 steps of a small model, then destroy_process_group()."""

import os

import torch
import torch.distributed as dist
from torch import nn

if __name__ == "__main__":
    dist.init_process_group("nccl")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    model = nn.parallel.DistributedDataParallel(nn.Linear(256, 16).to(device), device_ids=[device])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(20):
        opt.zero_grad()
        model(torch.randn(64, 256, device=device)).sum().backward()
        opt.step()
    dist.destroy_process_group()
