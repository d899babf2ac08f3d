"""A torchrun-style script: a tiny DDP model, 20 steps. Run under torchrun, or by `run recipe=script`."""

import torch
import torch.distributed as dist
from torch import nn


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(20):
        opt.zero_grad()
        model(torch.randn(8, 32)).sum().backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
