"""GPU throughput: a small transformer on synthetic tokens under bf16 autocast, timed after warm-up.

``python gpu_transformer.py STEPS OUT`` is the hand-written single-process loop; ``main(ctx, cfg)`` is the same
loop as a recipe under `run` (topology=1x1). Both write steps/s to OUT. The model keeps an H100/H200-class GPU
busy (each step is milliseconds of kernels), so what `run` adds around the loop shows in the ratio.
"""

import sys
import time

import torch
from torch import nn

WARMUP, BATCH, SEQ, WIDTH, LAYERS, VOCAB = 20, 32, 256, 512, 6, 8192


def model() -> nn.Module:
    layer = nn.TransformerEncoderLayer(WIDTH, nhead=8, dim_feedforward=4 * WIDTH, batch_first=True)
    return nn.Sequential(nn.Embedding(VOCAB, WIDTH), nn.TransformerEncoder(layer, LAYERS), nn.Linear(WIDTH, VOCAB))


def loop(net: nn.Module, steps: int, device: torch.device, sync=lambda: None) -> float:
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    g = torch.Generator(device=device).manual_seed(0)
    tokens = torch.randint(0, VOCAB, (8, BATCH, SEQ), device=device, generator=g)
    loss_fn = nn.CrossEntropyLoss()
    for i in range(steps + WARMUP):
        if i == WARMUP:
            torch.cuda.synchronize(device)
            sync()
            t0 = time.perf_counter()
        x = tokens[i % 8]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(net(x).flatten(0, 1), x.flatten())
        loss.backward()
        opt.step()
    torch.cuda.synchronize(device)
    return steps / (time.perf_counter() - t0)


def _write(out: str, rate: float) -> None:
    with open(out, "w") as f:
        f.write(f"{rate}\n")


def main(ctx, cfg) -> None:
    import torch.distributed as dist

    torch.manual_seed(0)
    rate = loop(ctx.wrap(model()), cfg.steps, ctx.device, dist.barrier)
    if ctx.is_main:
        _write(cfg.out, rate)


if __name__ == "__main__":
    torch.manual_seed(0)
    device = torch.device("cuda", 0)
    _write(sys.argv[2], loop(model().to(device), int(sys.argv[1]), device))
