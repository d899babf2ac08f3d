"""Handwritten digits (scikit-learn's bundled 8x8 images: real data, no download) with a small MLP.

The default job: ``run`` trains this on 1 host x 2 CPU processes and prints the test accuracy.
"""

from __future__ import annotations

import time

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import TensorDataset


def datasets(test_fraction: float, seed: int) -> tuple[TensorDataset, TensorDataset]:
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=test_fraction, random_state=seed, stratify=y)
    mean, std = x_train.mean(0), x_train.std(0) + 1e-6  # statistics of the training split only
    as_x = lambda a: torch.tensor((a - mean) / std, dtype=torch.float32)  # noqa: E731
    as_y = lambda a: torch.tensor(a, dtype=torch.long)  # noqa: E731
    return TensorDataset(as_x(x_train), as_y(y_train)), TensorDataset(as_x(x_test), as_y(y_test))


def build_model(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))


@torch.no_grad()
def accuracy(model: nn.Module, data: TensorDataset, device: torch.device) -> float:
    x, y = data.tensors
    model.eval()
    pred = model(x.to(device)).argmax(1)
    model.train()
    return (pred == y.to(device)).float().mean().item()


def main(ctx, cfg) -> dict:
    train, test = datasets(cfg.test_fraction, cfg.seed)
    model = ctx.wrap(build_model(cfg.hidden))
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    loader = ctx.loader(train)
    loss_fn = nn.CrossEntropyLoss()
    if ctx.is_main:
        print(f"digits: {len(train)} train / {len(test)} test images, {ctx.world_size} process(es), "
              f"global batch {cfg.global_batch_size} ({ctx.per_process_batch_size} per process), {cfg.epochs} epochs",
              flush=True)
    step, samples, t0 = 0, 0, time.perf_counter()
    for epoch in range(cfg.epochs):
        loader.sampler.set_epoch(epoch)
        total = 0.0
        for x, y in loader:
            x, y = x.to(ctx.device), y.to(ctx.device)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            total += loss.item()
            step += 1
            samples += cfg.global_batch_size
        elapsed = time.perf_counter() - t0
        if ctx.is_main and (epoch % 5 == 4 or epoch == cfg.epochs - 1):
            ctx.log(step, epoch=epoch + 1, loss=total / len(loader), samples_per_s=samples / elapsed,
                    test_accuracy=accuracy(ctx.unwrap(model), test, ctx.device))
    ctx.save_checkpoint({"model": ctx.unwrap(model).state_dict(), "optimizer": optimizer.state_dict(), "step": step})
    result = {"test_accuracy": accuracy(ctx.unwrap(model), test, ctx.device), "steps": step}
    if ctx.is_main:
        ctx.log(step, final=True, **result, echo=False)
        print(f"final test accuracy: {result['test_accuracy']:.4f} after {step} steps", flush=True)
    return result
