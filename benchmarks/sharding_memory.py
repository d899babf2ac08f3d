"""Sharding: per-process optimizer state, peak memory and step time of each mode against `none`.

    .venv/bin/python benchmarks/sharding_memory.py [--shapes 1x2 1x4] [--width 1024] [--depth 4] [--reps 1]

For each shape and each of none, oss, sdp, zero, fsdp, one `run` of an MLP (depth x Linear(width,
width), ~4.2M parameters by default) trained with Adam through ctx.setup
(benchmarks/workloads/sharding_bench.py). Every rank measures

* the optimizer-state bytes it holds (ctx.optimizer_state_bytes),
* its peak memory: on CPU the most tensor memory it held at once during the warm-up steps (the running
  sum of torch's allocations and frees from torch.profiler(profile_memory=True), counted from before
  the model is built: parameters, gradients, optimizer state, activations, DDP/FSDP buckets);
  tracemalloc does not see torch's allocator, and the resident set also counts the library code the
  first steps page in (the same ~100+ MiB in every mode) -- it is recorded too, as
  peak_rss_delta_bytes, for comparison; on CUDA torch.cuda.max_memory_allocated,
* the median step time after warm-up, without the profiler (steps start together behind a barrier).

A mode's figure is the largest over its ranks (the rank that runs out of memory, or that everyone
waits for), and its ratio is against `none` at the same shape, measured in this same invocation
(modes interleaved, medians over --reps). On a CPU machine with fewer cores than processes the
step times are oversubscribed: compare modes at one shape, not shapes. Results:
benchmarks/results/sharding_memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORK = HERE / "workloads"
RUN = str(Path(sys.executable).parent / "run")
MODES = ("none", "oss", "sdp", "zero", "fsdp")
FIGURES = ("optimizer_state_bytes", "peak_bytes", "peak_rss_delta_bytes", "step_s")


def measure(shape: str, mode: str, args: argparse.Namespace, cwd: Path) -> list[dict]:
    out = cwd / f"{shape}-{mode}-{len(list(cwd.iterdir()))}"
    out.mkdir()
    argv = [RUN, f"topology={shape}", f"sharding={mode}", "recipe=custom", "recipe.target=sharding_bench:main",
            f"+recipe.out_dir={out}", f"+recipe.width={args.width}", f"+recipe.depth={args.depth}",
            f"+recipe.steps={args.steps}", f"+recipe.warmup={args.warmup}",
            f"recipe.global_batch_size={args.global_batch}", *args.extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(WORK), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(argv)}\n{proc.stdout}\n{proc.stderr}")
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["1x2", "1x4"])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--global-batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("extra", nargs="*", help="more `run` overrides, e.g. device=cuda")
    args = parser.parse_args()
    modes = ["none", *[m for m in args.modes if m != "none"]]

    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="sharding-bench-") as tmp:
        cwd = Path(tmp)
        for shape in args.shapes:
            reps: dict[str, list[list[dict]]] = {m: [] for m in modes}
            for _ in range(args.reps):
                for mode in modes:  # interleaved: drift in the machine's load spreads over every mode
                    reps[mode].append(measure(shape, mode, args, cwd))
            per_mode = {}
            for mode, runs in reps.items():
                worst = {f: statistics.median(max(r[f] or 0 for r in ranks) for ranks in runs) for f in FIGURES}
                per_mode[mode] = {**worst, "ranks": runs[-1]}
            for mode, r in per_mode.items():
                r["ratio_vs_none"] = {f: r[f] / per_mode["none"][f] if per_mode["none"][f] else None for f in FIGURES}
            world = len(per_mode["none"]["ranks"])
            results[shape] = {"world_size": world, "ideal_sharded_ratio": 1 / world, "modes": per_mode}

    first = results[args.shapes[0]]["modes"]["none"]["ranks"][0]
    import torch

    try:
        import fairscale
        fs_version = fairscale.__version__
    except ImportError:
        fs_version = None
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, torch {torch.__version__}, " \
              f"fairscale {fs_version}, backend {first['backend']}"
    print(f"sharding: {first['params'] / 1e6:.2f}M-parameter MLP ({args.depth} x Linear({args.width}, {args.width})), "
          f"Adam, global batch {args.global_batch}, {args.steps} timed steps; {machine}")
    print(f"peak memory: {first['peak_method']}")
    print("figures: the largest over the ranks; ratio: against `none` at the same shape, this invocation")
    for shape, res in results.items():
        print(f"\n  {shape} ({res['world_size']} processes; ideal sharded ratio 1/{res['world_size']} = "
              f"{res['ideal_sharded_ratio']:.2f})")
        print(f"    {'mode':6s} {'optimizer state/proc':>22s} {'peak tensors/proc':>20s} {'step time':>18s}"
              f" {'(peak RSS delta/proc)':>24s}")
        for mode, r in res["modes"].items():
            q = r["ratio_vs_none"]
            print(f"    {mode:6s} {r['optimizer_state_bytes'] / 2**20:9.2f} MiB ({q['optimizer_state_bytes']:4.2f}x)"
                  f" {r['peak_bytes'] / 2**20:9.1f} MiB ({q['peak_bytes']:4.2f}x)"
                  f" {r['step_s'] * 1e3:8.1f} ms ({q['step_s']:4.2f}x)"
                  f"   ({r['peak_rss_delta_bytes'] / 2**20:7.1f} MiB, {q['peak_rss_delta_bytes'] or 0:4.2f}x)")
    out = HERE / "results" / "sharding_memory.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"date": date.today().isoformat(), "machine": machine, "params": first["params"],
                               "width": args.width, "depth": args.depth, "global_batch": args.global_batch,
                               "steps": args.steps, "warmup": args.warmup, "reps": args.reps,
                               "peak_method": first["peak_method"], "results": results}, indent=2))
    print(f"\nwritten: {out}")


if __name__ == "__main__":
    main()
