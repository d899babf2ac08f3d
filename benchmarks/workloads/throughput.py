"""Training throughput: the digits MLP on synthetic batches, timed after warm-up.

``python throughput.py N STEPS OUT`` is the hand-written torch.multiprocessing DDP loop;
``main(ctx, cfg)`` is the same loop as a recipe under `run`. Both write steps/s to OUT.
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

WARMUP = 20


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def loop(ddp: nn.Module, steps: int, per_process_batch: int) -> float:
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(dist.get_rank())
    xs = torch.randn(steps + WARMUP, per_process_batch, 64, generator=g)
    ys = torch.randint(0, 10, (steps + WARMUP, per_process_batch), generator=g)
    loss_fn = nn.CrossEntropyLoss()
    for i in range(steps + WARMUP):
        if i == WARMUP:
            dist.barrier()
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_fn(ddp(xs[i]), ys[i]).backward()
        opt.step()
    dist.barrier()
    return steps / (time.perf_counter() - t0)


def _write(out: str, rate: float) -> None:
    with open(out, "w") as f:
        f.write(f"{rate}\n")


def main(ctx, cfg) -> None:
    rate = loop(ctx.wrap(model()), cfg.steps, ctx.per_process_batch_size)
    if ctx.is_main:
        _write(cfg.out, rate)


def _worker(rank: int, world: int, port: int, steps: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    rate = loop(nn.parallel.DistributedDataParallel(model()), steps, 64 // world)
    if rank == 0:
        _write(out, rate)
    dist.destroy_process_group()


if __name__ == "__main__":
    import socket

    import torch.multiprocessing as mp

    world, steps, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(world, port, steps, out), nprocs=world)
