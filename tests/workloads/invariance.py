"""A fixed regression problem trained for a few steps; the main rank saves the final weights."""

from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset


def main(ctx, cfg):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(256, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(256, 1, generator=g)
    model = ctx.wrap(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)))
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    loader = ctx.loader(TensorDataset(x, y))
    step = 0
    for epoch in range(cfg.epochs):
        loader.sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            nn.functional.mse_loss(model(xb), yb).backward()
            opt.step()
            step += 1
    if ctx.is_main:
        torch.save({"state": ctx.unwrap(model).state_dict(), "steps": step}, Path(cfg.out_dir, "weights.pt"))
