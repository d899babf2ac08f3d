"""An MLP of a few million parameters trained with Adam through ctx.setup, measured per rank.

Each rank writes ``<out_dir>/rank<r>.json`` with:

* ``optimizer_state_bytes``: the optimizer state this process holds (ctx.optimizer_state_bytes);
* ``peak_bytes``: the most tensor memory this process held at once while training: the running sum of
  torch's allocations and frees (torch.profiler with profile_memory=True, from before the model is
  built to the end of the profiled warm-up steps), at its highest during those steps. It counts
  parameters, gradients, optimizer state, activations and DDP/FSDP buckets, and nothing else (no
  library code, no allocator slack); on CUDA, ``torch.cuda.max_memory_allocated()`` over the same steps;
* ``peak_rss_delta_bytes``: for comparison, the peak resident set during those steps (VmHWM, reset
  after setup) minus the resident set before the model was built: it also counts library code and
  data that the first steps page in (the same in every mode) and memory malloc keeps;
* ``step_s``: the median wall time of a step (forward, backward, optimizer step) after warm-up,
  without the profiler.
"""

import json
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current VmRSS (Linux >= 4.0)
        return True
    except OSError:
        return False


def build(width: int, depth: int) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers[:-1])


def _tensor_peak(prof, window: str) -> int:
    """Highest running sum of CPU allocations (+) and frees (-) inside the record_function ``window``."""
    events = prof.profiler.kineto_results.events()
    start, end = next((e.start_ns(), e.end_ns()) for e in events if e.name() == window)
    memory = sorted((e.start_ns(), e.nbytes()) for e in events
                    if e.name() == "[memory]" and str(e.device_type()).endswith("CPU"))
    live = peak = 0
    for t, nbytes in memory:
        live += nbytes
        if start <= t <= end:
            peak = max(peak, live)
    return peak


def _step(ctx, model, optimizer, x) -> None:
    optimizer.zero_grad(set_to_none=True)
    model(x).square().mean().backward()
    optimizer.step()


def main(ctx, cfg):
    from torch.profiler import ProfilerActivity, profile, record_function

    cuda = ctx.device.type == "cuda"
    torch.manual_seed(cfg.seed)
    g = torch.Generator().manual_seed(1000 + ctx.rank)
    batch = ctx.per_process_batch_size
    batches = [torch.randn(batch, cfg.width, generator=g) for _ in range(4)]
    ctx.barrier()
    base_rss = _status_kib("VmRSS") * 1024
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        module = build(cfg.width, cfg.depth)
        params = sum(p.numel() for p in module.parameters())
        model, optimizer = ctx.setup(module, torch.optim.Adam, lr=1e-4)
        del module
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base_cuda = torch.cuda.memory_allocated()
        resettable = _reset_peak()
        with record_function("warmup"):
            for step in range(cfg.warmup):  # the first step allocates the optimizer state
                _step(ctx, model, optimizer, batches[step % len(batches)].to(ctx.device))
    peak_rss = _status_kib("VmHWM") * 1024 - base_rss if resettable else None
    if cuda:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base_cuda
        method = "torch.cuda.max_memory_allocated during the warm-up steps"
    else:
        peak = _tensor_peak(prof, "warmup")
        method = "torch.profiler(profile_memory=True): peak live tensor bytes during the warm-up steps"
    times = []
    for step in range(cfg.steps):
        x = batches[step % len(batches)].to(ctx.device)
        if cuda:
            torch.cuda.synchronize()
        ctx.barrier()  # every step starts together: the time is the job's, not one rank's
        t0 = time.perf_counter()
        _step(ctx, model, optimizer, x)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    record = {
        "rank": ctx.rank, "world_size": ctx.world_size, "mode": ctx.sharding_mode, "params": params,
        "optimizer_state_bytes": ctx.optimizer_state_bytes(optimizer),
        "peak_bytes": peak, "peak_method": method, "peak_rss_delta_bytes": peak_rss,
        "step_s": statistics.median(times), "steps": cfg.steps, "per_process_batch": batch,
        "threads": torch.get_num_threads(), "backend": dist.get_backend() if dist.is_initialized() else None,
    }
    Path(cfg.out_dir, f"rank{ctx.rank}.json").write_text(json.dumps(record))
