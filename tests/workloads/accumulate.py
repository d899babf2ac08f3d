"""Steps through ctx.micro_batches on a DDP model whose gradient exchanges are counted (a comm hook around DDP's own
all-reduce): with ``recipe.micro_batch_size`` each step runs several micro-batches and one exchange.

Writes ``rank<r>.json`` into ``out_dir``: the steps, the micro-batches and their sizes and weights seen per step, the
exchanges, and DDP's buckets (an exchange is one hook call per bucket)."""

import json
from pathlib import Path

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.utils.data import TensorDataset


def main(ctx, cfg):
    torch.manual_seed(0)
    model, optimizer = ctx.setup(nn.Linear(4, 1), torch.optim.SGD, lr=0.1)
    calls = []

    def counted(state, bucket):
        calls.append(bucket.index())
        return allreduce_hook(state, bucket)

    model.register_comm_hook(None, counted)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(cfg.global_batch_size * cfg.steps, 4, generator=g),
                         torch.randn(cfg.global_batch_size * cfg.steps, 1, generator=g))
    steps, seen = 0, []
    for x, y in ctx.loader(data, shuffle=False):
        optimizer.zero_grad()
        micro = []
        for (xm, ym), weight, share in ctx.micro_batches((x, y), model):
            (nn.functional.mse_loss(model(xm), ym) * weight).backward()
            micro.append([len(xm), weight, share])
        optimizer.step()
        seen.append(micro)
        steps += 1
    record = {"steps": steps, "micro": seen, "exchanges": len(calls), "buckets": len(set(calls)),
              "share": ctx.per_process_batch_size}
    Path(cfg.out_dir, f"rank{ctx.rank}.json").write_text(json.dumps(record))
