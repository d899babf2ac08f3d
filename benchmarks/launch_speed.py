"""Launch speed and training throughput of `run`, against references measured in the same run.

    .venv/bin/python benchmarks/launch_speed.py [--reps 3] [--sizes 2 4]

Whole-command wall time of the same 20-step tiny DDP job under: `run` (a recipe), `run recipe=script`
(the unchanged torchrun-style script), `torchrun --standalone`, a bare `mp.spawn` script, and the floor
(N processes that only import torch and rendezvous). Then training throughput (steps/s of the digits
MLP after warm-up) under `run` against a hand-written torch.multiprocessing DDP loop, both with the
same OMP_NUM_THREADS. Medians over --reps interleaved repetitions; ratios are against the references
of this same run. Results: benchmarks/results/launch_speed.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from sessions import in_session

HERE = Path(__file__).resolve().parent
WORK = HERE / "workloads"
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(WORK), **extra}
    env.pop("OMP_NUM_THREADS", None) if "OMP_NUM_THREADS" not in extra else None
    return env


FAILURES: dict[str, list[str]] = {}  # command name -> the last line of each failed attempt
ATTEMPTS = 3
HANG_S = 120


def _timed(argv: list[str], cwd: Path, env: dict[str, str], name: str = "") -> float:
    """Seconds of one successful run. A failed attempt (e.g. torch's occasional teardown abort,
    "terminate called without an active exception") is recorded in FAILURES and retried."""
    for _ in range(ATTEMPTS):
        ended = in_session(argv, cwd, HANG_S, env)  # its own session: a hung command and all it started are ended
        if ended.code is None:
            FAILURES.setdefault(name or argv[0], []).append(f"hung: no exit after {HANG_S} s")
            continue
        if ended.code == 0:
            return ended.seconds
        lines = [line for line in ended.output.splitlines() if line.strip()]
        FAILURES.setdefault(name or argv[0], []).append(f"exit {ended.code}: {lines[-1][:160] if lines else ''}")
    raise SystemExit(f"benchmark command failed {ATTEMPTS} times: {' '.join(argv)}\n{FAILURES[name or argv[0]]}")


def _floor(n: int, cwd: Path) -> float:
    port = _free_port()
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, str(WORK / "floor.py")], cwd=cwd,
                              env=_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE=str(n)))
             for r in range(n)]
    codes = [p.wait() for p in procs]
    elapsed = time.perf_counter() - t0
    if any(codes):
        raise SystemExit(f"floor processes failed: {codes}")
    return elapsed


def launch_commands(n: int) -> dict[str, list[str]]:
    return {
        "run (recipe)": [str(BIN / "run"), f"topology=1x{n}", "recipe=custom", "recipe.target=tiny_recipe:main",
                         f"recipe.global_batch_size={n}"],
        "run (script)": [str(BIN / "run"), f"topology=1x{n}", "recipe=script", f"recipe.path={WORK / 'tiny_ddp.py'}"],
        "torchrun --standalone": [str(BIN / "torchrun"), "--standalone", f"--nproc-per-node={n}", str(WORK / "tiny_ddp.py")],
        "mp.spawn script": [sys.executable, str(WORK / "spawn_ddp.py"), str(n)],
    }


def measure_launch(sizes: list[int], reps: int, cwd: Path) -> dict:
    results: dict = {}
    for n in sizes:
        times: dict[str, list[float]] = {name: [] for name in [*launch_commands(n), "floor (import + rendezvous)"]}
        for _ in range(reps):
            for name, argv in launch_commands(n).items():
                times[name].append(_timed(argv, cwd, _env(), f"{name} ({n})"))
            times["floor (import + rendezvous)"].append(_floor(n, cwd))
        med = {k: statistics.median(v) for k, v in times.items()}
        results[n] = {"median_s": med, "all_s": times,
                      "ratio_vs_torchrun": {k: v / med["torchrun --standalone"] for k, v in med.items()},
                      "ratio_vs_mp_spawn": {k: v / med["mp.spawn script"] for k, v in med.items()},
                      "ratio_vs_floor": {k: v / med["floor (import + rendezvous)"] for k, v in med.items()}}
    return results


def measure_throughput(sizes: list[int], reps: int, steps: int, cwd: Path) -> dict:
    results: dict = {}
    for n in sizes:
        threads = str(max(1, (os.cpu_count() or 1) // n))
        rates: dict[str, list[float]] = {"run": [], "hand-written mp DDP": []}
        commands = {
            "hand-written mp DDP": lambda out: [sys.executable, str(WORK / "throughput.py"), str(n), str(steps), str(out)],
            "run": lambda out: [str(BIN / "run"), f"topology=1x{n}", "recipe=custom", "recipe.target=throughput:main",
                                "recipe.global_batch_size=64", f"+recipe.steps={steps}", f"+recipe.out={out}"],
        }
        for i in range(reps):
            order = list(commands) if i % 2 == 0 else list(reversed(commands))  # neither always goes first
            for name in order:
                out = cwd / f"rate-{n}-{i}-{name[:3]}"
                _timed(commands[name](out), cwd, _env(OMP_NUM_THREADS=threads), f"{name} throughput ({n})")
                rates[name].append(float(out.read_text()))
        med = {k: statistics.median(v) for k, v in rates.items()}
        results[n] = {"median_steps_per_s": med, "all": rates, "ratio": med["run"] / med["hand-written mp DDP"]}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=1500, help="timed training steps for throughput")
    parser.add_argument("--only", choices=["launch", "throughput"], help="measure one part only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="launch-bench-") as tmp:
        cwd = Path(tmp)
        launch = measure_launch(args.sizes, args.reps, cwd) if args.only != "throughput" else {}
        throughput = measure_throughput(args.sizes, args.reps, args.steps, cwd) if args.only != "launch" else {}
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    print(f"launch: whole-command seconds (median of {args.reps}), {machine}")
    for n, r in launch.items():
        print(f"\n  {n} processes")
        for name, s in r["median_s"].items():
            print(f"    {name:28s} {s:6.2f} s   {r['ratio_vs_torchrun'][name]:.2f}x torchrun   "
                  f"{r['ratio_vs_mp_spawn'][name]:.2f}x mp.spawn   {r['ratio_vs_floor'][name]:.2f}x floor")
    print("\nthroughput: steps/s after warm-up (median)")
    for n, r in throughput.items():
        med = r["median_steps_per_s"]
        print(f"  {n} processes: run {med['run']:.1f}, hand-written {med['hand-written mp DDP']:.1f}, "
              f"ratio {r['ratio']:.3f}")
    if FAILURES:
        print("\nfailed attempts (retried):")
        for name, fails in FAILURES.items():
            print(f"  {name}: {len(fails)} x, last: {fails[-1]}")
    out = HERE / "results" / "launch_speed.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"date": date.today().isoformat(), "machine": machine, "reps": args.reps,
                               "launch": launch, "throughput": throughput, "failed_attempts": FAILURES},
                              indent=2))
    print(f"\nwritten: {out}")


if __name__ == "__main__":
    main()
