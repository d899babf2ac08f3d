"""`run -- tiny.py` against `torchrun --standalone tiny.py`, paired: the same unchanged script, both launchers one
right after the other (which goes first alternates), at 2 and at 4 processes.

    .venv/bin/python benchmarks/torchrun_pairs.py [--pairs 14] [--sizes 2 4]

The script (benchmarks/workloads/tiny_ddp.py) is an everyday DDP script: main() makes the model and an SGD optimizer,
trains 20 steps, destroys its process group and returns. Per size: the median whole-command wall time of each launcher
over its successful runs, their ratio (the target: `run` at most 0.55x torchrun), and how many runs of each ended
badly, two kinds counted apart: a teardown abort (the 20 steps finished but a rank died at interpreter teardown,
"terminate called without an active exception", SIGABRT, which torchrun reports as a failed job) and a hang (no
end within HANG_S: killed, and counted). Nothing is retried: every run counts. Results:
benchmarks/results/torchrun_pairs.json.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import result_file

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "workloads" / "tiny_ddp.py"
BIN = Path(sys.executable).parent
HANG_S = 60  # a run not ended by then is a hang (a 20-step job takes seconds)
ABORT_WORDS = ("terminate called without an active exception", "SIGABRT", "Signal 6", "killed by SIGABRT")


def commands(n: int, run_id: str) -> dict[str, list[str]]:
    return {
        "torchrun --standalone": [str(BIN / "torchrun"), "--standalone", f"--nproc-per-node={n}", SCRIPT.name],
        "run --": [str(BIN / "run"), f"topology=1x{n}", f"run_id={run_id}", "--", SCRIPT.name],
    }


def one(argv: list[str], cwd: Path) -> dict:
    """One launch: its wall time, exit status, and whether it ended in a teardown abort."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OMP_NUM_THREADS")}
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # its own group: a hung launch and what it started can be ended
    try:
        out, _ = proc.communicate(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return {"seconds": None, "code": None, "abort": False, "hung": True, "last": f"no exit after {HANG_S} s"}
    seconds = time.perf_counter() - t0
    lines = [line for line in out.splitlines() if line.strip()]
    abort = proc.returncode != 0 and any(w in out for w in ABORT_WORDS)
    return {"seconds": seconds, "code": proc.returncode, "abort": abort, "hung": False,
            "last": lines[-1][:200] if proc.returncode and lines else ""}


def measure(sizes: list[int], pairs: int, cwd: Path) -> dict:
    results = {}
    for n in sizes:
        runs: dict[str, list[dict]] = {name: [] for name in commands(n, "x")}
        for i in range(pairs):
            order = list(commands(n, f"pair{n}-{i}").items())
            if i % 2:
                order.reverse()
            for name, argv in order:
                runs[name].append(one(argv, cwd))
        med = {name: statistics.median([r["seconds"] for r in rs if r["code"] == 0]) for name, rs in runs.items()
               if any(r["code"] == 0 for r in rs)}
        results[n] = {
            "median_s": med,
            "ratio_run_vs_torchrun": med["run --"] / med["torchrun --standalone"] if len(med) == 2 else None,
            "runs": len(runs["run --"]),
            "failed": {name: sum(1 for r in rs if r["code"] != 0) for name, rs in runs.items()},
            "teardown_aborts": {name: sum(1 for r in rs if r["abort"]) for name, rs in runs.items()},
            "hangs": {name: sum(1 for r in rs if r["hung"]) for name, rs in runs.items()},
            "failures": {name: [r["last"] for r in rs if r["code"] != 0] for name, rs in runs.items()},
            "all_s": {name: [r["seconds"] for r in rs] for name, rs in runs.items()},
        }
    return results


def _other(result: dict, name: str) -> int:
    """Failed runs that were neither a teardown abort nor a hang."""
    return result["failed"][name] - result["teardown_aborts"][name] - result["hangs"][name]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=14)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="torchrun-pairs-") as tmp:
        cwd = Path(tmp)
        (cwd / SCRIPT.name).write_text(SCRIPT.read_text())  # the user's folder holds the script
        results = measure(args.sizes, args.pairs, cwd)
    out = result_file.write("torchrun_pairs", pairs=args.pairs, results=results)
    for n, r in results.items():
        med = r["median_s"]
        print(f"{n} processes: run -- {med.get('run --', float('nan')):.2f} s, torchrun --standalone "
              f"{med.get('torchrun --standalone', float('nan')):.2f} s: {r['ratio_run_vs_torchrun']:.2f}x; "
              f"teardown aborts: run {r['teardown_aborts']['run --']}/{r['runs']}, torchrun "
              f"{r['teardown_aborts']['torchrun --standalone']}/{r['runs']}; hangs: run {r['hangs']['run --']}/"
              f"{r['runs']}, torchrun {r['hangs']['torchrun --standalone']}/{r['runs']}; other failures: "
              f"run {_other(r, 'run --')}, torchrun {_other(r, 'torchrun --standalone')}")
    print(f"written: {out}")


if __name__ == "__main__":
    main()
