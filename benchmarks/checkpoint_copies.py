"""What keeping every host's copy of a checkpoint costs a save (a job that outlives its hosts: runner.training.copies):
``ctx.save_checkpoint`` of a state of --mib MiB on two "hosts" of one gloo process, each with a run folder of its
own, with the copy to the other host against rank 0's local write alone, in the same run.

    .venv/bin/python benchmarks/checkpoint_copies.py [--mib 1024 4096]

For each size and way, two fresh processes (benchmarks/workloads/copy_rank.py): the seconds the save held each rank
(with the copy: rank 0 writes its file, then sends it in 64 MiB chunks to rank 1, which writes its copy as they
come; both wait for the copy), and each rank's peak memory growth during the save (rank 1 holds a chunk, never the
file). Ratio: the save with the copy over the local save, rank 0's seconds. Linux only (VmHWM).
Results: benchmarks/results/checkpoint_copies.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
WAYS = {"local": "0", "copies": "1"}


def measure(mib: int, folder: Path) -> dict:
    results = {}
    for way, every_host in WAYS.items():
        procs = [subprocess.Popen([sys.executable, str(HERE / "workloads" / "copy_rank.py"), str(r), str(folder),
                                   str(mib), every_host]) for r in (0, 1)]
        codes = [p.wait(timeout=1800) for p in procs]
        if codes != [0, 0]:
            raise SystemExit(f"{way}: the ranks exited {codes}")
        results[way] = {f"rank{r}": json.loads((folder / f"{way}-rank{r}.json").read_text()) for r in (0, 1)}
    return {"mib": mib, "ways": results,
            "ratio_copies_vs_local": round(results["copies"]["rank0"]["seconds"] / results["local"]["rank0"]["seconds"],
                                           2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, nargs="+", default=[1024, 4096], help="the checkpoints' sizes")
    args = parser.parse_args()
    sizes = []
    for mib in args.mib:
        with tempfile.TemporaryDirectory(prefix="checkpoint-copies-") as folder:
            sizes.append(measure(mib, Path(folder)))
        print(json.dumps(sizes[-1]), flush=True)
    out = {"date": date.today().isoformat(), "sizes": sizes,
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__}}
    (HERE / "results" / "checkpoint_copies.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
