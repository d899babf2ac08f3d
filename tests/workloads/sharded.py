"""N Adam steps of an MLP through ctx.setup, under whatever sharding the spec says.

Writes into ``out_dir``: ``rank<r>.json`` (world size, mode, steps, this rank's optimizer-state
bytes, and the rank's view of the parameters: numel held locally), ``final.pt`` (the full
consolidated state after training, from rank 0) and, when resuming, ``loaded.pt`` (the full state
right after loading the checkpoint, before any step). The run's ``checkpoints/last.pt`` holds the
full state and the step count (ctx.save_checkpoint), for another run to resume from.

Config: ``width`` and ``depth`` (``depth`` hidden Linear(width, width) layers of equal size, so that
per-tensor partitions (oss, sdp, zero) can balance), ``steps``, ``lr``, ``resume`` (a checkpoint).
"""

import json
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset


def build(width: int, depth: int, inputs: int = 16, outputs: int = 4) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(inputs, width), nn.Tanh()]
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.Tanh()]
    layers.append(nn.Linear(width, outputs))
    return nn.Sequential(*layers)


def data(samples: int) -> TensorDataset:
    g = torch.Generator().manual_seed(4321)
    x = torch.randn(samples, 16, generator=g)
    y = torch.tanh(x @ torch.randn(16, 4, generator=g)) + 0.05 * torch.randn(samples, 4, generator=g)
    return TensorDataset(x, y)


def main(ctx, cfg):
    out = Path(cfg.out_dir)
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank and in every run
    model, optimizer = ctx.setup(build(cfg.width, cfg.depth), torch.optim.Adam, lr=cfg.lr)
    step = 0
    if cfg.get("resume"):
        saved = ctx.load_checkpoint(path=cfg.resume, model=model, optimizer=optimizer)
        step = saved["step"]
        loaded = ctx.full_state(model, optimizer)
        if ctx.is_main:
            torch.save({"step": step, **loaded}, out / "loaded.pt")
    loader = ctx.loader(data(cfg.global_batch_size * 8))  # 8 global batches per epoch
    target = step + cfg.steps
    epoch = step // len(loader)
    while step < target:
        loader.sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            if epoch * len(loader) + i < step:
                continue  # resumed mid-epoch: skip the batches already taken
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x.to(ctx.device)), y.to(ctx.device)).backward()
            optimizer.step()
            step += 1
            if step == target:
                break
        epoch += 1
    record = {"rank": ctx.rank, "world_size": ctx.world_size, "mode": ctx.sharding_mode, "steps": step,
              "optimizer_state_bytes": ctx.optimizer_state_bytes(optimizer),
              "local_param_numel": sum(getattr(p, "to_local", lambda: p)().numel() for p in model.parameters()),
              "wrapped": type(model).__name__, "optimizer": type(optimizer).__name__}
    Path(out, f"rank{ctx.rank}.json").write_text(json.dumps(record))
    full = ctx.full_state(model, optimizer)
    if ctx.is_main:
        torch.save({"step": step, **full}, out / "final.pt")
    ctx.save_checkpoint({"step": step}, model=model, optimizer=optimizer)
