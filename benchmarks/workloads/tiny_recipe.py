"""The same 20 steps as tiny_ddp.py, written as a recipe."""

import torch
from torch import nn


def main(ctx, cfg) -> None:
    model = ctx.wrap(nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(20):
        opt.zero_grad()
        model(torch.randn(8, 32)).sum().backward()
        opt.step()
