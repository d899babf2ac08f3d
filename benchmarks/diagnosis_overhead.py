"""What recording collectives for a hang's diagnosis costs: training throughput under `run` with the default
log.collectives=200 (torch's flight recorder on in every rank, and each rank's watch thread) against
log.collectives=0 (no recording), interleaved in the same run.

    .venv/bin/python benchmarks/diagnosis_overhead.py [--reps 5] [--sizes 2 4] [--steps 1500]

The workload is benchmarks/workloads/throughput.py (the digits MLP on synthetic batches, an all-reduce per
step: many small collectives, the worst case for a per-collective cost). Results:
benchmarks/results/diagnosis_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from launch_speed import BIN, HERE, _env, _timed  # noqa: E402


def measure(sizes: list[int], reps: int, steps: int, cwd: Path) -> dict:
    results: dict = {}
    for n in sizes:
        threads = str(max(1, (os.cpu_count() or 1) // n))
        rates: dict[str, list[float]] = {"recording (log.collectives=200)": [], "not recording (log.collectives=0)": []}
        settings = {"recording (log.collectives=200)": "200", "not recording (log.collectives=0)": "0"}
        for i in range(reps):
            order = list(settings) if i % 2 == 0 else list(reversed(settings))  # neither always goes first
            for name in order:
                out = cwd / f"rate-{n}-{i}-{settings[name]}"
                argv = [str(BIN / "run"), f"topology=1x{n}", "recipe=custom", "recipe.target=throughput:main",
                        "recipe.global_batch_size=64", f"+recipe.steps={steps}", f"+recipe.out={out}",
                        f"log.collectives={settings[name]}"]
                _timed(argv, cwd, _env(OMP_NUM_THREADS=threads), f"{name} ({n})")
                rates[name].append(float(out.read_text()))
        med = {k: statistics.median(v) for k, v in rates.items()}
        on, off = med["recording (log.collectives=200)"], med["not recording (log.collectives=0)"]
        results[n] = {"median_steps_per_s": med, "all": rates, "ratio": on / off}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=1500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="diagnosis-bench-") as tmp:
        results = measure(args.sizes, args.reps, args.steps, Path(tmp))
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    print(f"diagnosis overhead: steps/s after warm-up (median of {args.reps}), {machine}")
    for n, r in results.items():
        med = r["median_steps_per_s"]
        print(f"  {n} processes: " + ", ".join(f"{k} {v:.1f}" for k, v in med.items()) + f"; ratio {r['ratio']:.3f}")
    out = HERE / "results" / "diagnosis_overhead.json"
    out.write_text(json.dumps({"date": date.today().isoformat(), "machine": machine, "reps": args.reps,
                               "steps": args.steps, "results": results}, indent=2))
    print(f"written: {out}")


if __name__ == "__main__":
    main()
