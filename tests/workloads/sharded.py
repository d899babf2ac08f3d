"""N Adam steps of an MLP through ctx.setup, under whatever sharding the spec says.

Writes into ``out_dir``: ``rank<r>.json`` (world size, mode, steps, this rank's optimizer-state
bytes, and the rank's view of the parameters: numel held locally), ``final.pt`` (the full
consolidated state after training, from rank 0) and, when resuming, ``loaded.pt`` (the full state
right after loading the checkpoint, before any step). The run's ``checkpoints/last.pt`` holds the
full state and the step count (ctx.save_checkpoint), for another run to resume from.

Config: ``width`` and ``depth`` (``depth`` hidden Linear(width, width) layers of equal size, so that
per-tensor partitions (oss, sdp, zero) can balance), ``steps``, ``lr``, ``resume`` (a checkpoint), ``groups``
(AdamW with parameter groups, through ``make_optimizer``: weight decay on the matrices, none on the biases; else
Adam).
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


def adamw_groups(model: nn.Module, lr: float) -> torch.optim.AdamW:
    """AdamW without weight decay on biases (and norms): what ``ctx.setup(model, torch.optim.AdamW, ...)`` cannot say."""
    matrices = [p for p in model.parameters() if p.ndim >= 2]
    others = [p for p in model.parameters() if p.ndim < 2]
    return torch.optim.AdamW([{"params": matrices, "weight_decay": 0.1}, {"params": others, "weight_decay": 0.0}],
                             lr=lr)


def main(ctx, cfg):
    out = Path(cfg.out_dir)
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank and in every run
    if cfg.get("groups"):
        model, optimizer = ctx.setup(build(cfg.width, cfg.depth), make_optimizer=lambda m: adamw_groups(m, cfg.lr))
    else:
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
              "wrapped": type(model).__name__, "optimizer": type(optimizer).__name__,
              # the weight decay of each group: the sharded optimizer's, and that of the one it holds this rank's share in
              "weight_decay": [g["weight_decay"] for g in optimizer.param_groups],
              "local_weight_decay": [g["weight_decay"] for g in getattr(optimizer, "optim", optimizer).param_groups
                                     if g["params"]]}
    Path(out, f"rank{ctx.rank}.json").write_text(json.dumps(record))
    full = ctx.full_state(model, optimizer)
    if ctx.is_main:
        torch.save({"step": step, **full}, out / "final.pt")
    ctx.save_checkpoint({"step": step}, model=model, optimizer=optimizer)
