"""What a rank's memory grows by while it gets rank 0's checkpoint on a host that does not see rank 0's file: the
file's bytes as one pickled object (``broadcast_object_list``, the runner's way before) against chunks of at most
64 MiB (``broadcast_file``, through ``ctx.load_checkpoint``), in the same run.

    .venv/bin/python benchmarks/checkpoint_broadcast.py [--mib 1024]

Two gloo processes on this machine per way, fresh for each (so that one way's peak cannot hide the other's);
rank 0 sees the checkpoint (a state of --mib MiB of float32 tensors), rank 1 sees none, and each writes the peak
growth of its resident set during the load, from the whole object's start to the loaded state on the CPU
(benchmarks/workloads/checkpoint_rank.py). The loaded state itself is in both figures. Linux only (VmHWM).
Results: benchmarks/results/checkpoint_broadcast.json.
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
WAYS = {"whole": "one pickled object (broadcast_object_list)", "chunked": "64 MiB chunks (broadcast_file)"}
TENSOR_MIB = 64  # the checkpoint's tensors: a state_dict of this many MiB each


def _checkpoint(path: Path, mib: int) -> None:
    path.parent.mkdir(parents=True)
    count = max(1, mib // TENSOR_MIB)
    per = mib * 2**20 // count // 4
    torch.save({"step": 1, "model": {f"layer{i}.weight": torch.ones(per) for i in range(count)}}, path)


def measure(mib: int, folder: Path) -> dict:
    sent = folder / "host0" / "checkpoints" / "last.pt"
    _checkpoint(sent, mib)
    (folder / "host1" / "checkpoints").mkdir(parents=True)
    results = {}
    for way in WAYS:
        procs = [subprocess.Popen([sys.executable, str(HERE / "workloads" / "checkpoint_rank.py"), str(r), str(folder),
                                   way]) for r in (0, 1)]
        codes = [p.wait(timeout=900) for p in procs]
        if codes != [0, 0]:
            raise SystemExit(f"{way}: the ranks exited {codes}")
        results[way] = {f"rank{r}": json.loads((folder / f"{way}-rank{r}.json").read_text()) for r in (0, 1)}
    ratio = {rank: results["chunked"][rank]["peak_growth_bytes"] / results["whole"][rank]["peak_growth_bytes"]
             for rank in ("rank0", "rank1")}
    return {"file_bytes": sent.stat().st_size, "ways": {WAYS[w]: r for w, r in results.items()},
            "ratio_chunked_vs_whole": ratio}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=1024, help="the checkpoint's size")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="checkpoint-bench-") as tmp:
        result = measure(args.mib, Path(tmp))
    machine = {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
               "torch": torch.__version__}
    print(f"checkpoint broadcast: a {result['file_bytes'] / 2**20:.0f} MiB checkpoint to a rank without the file, "
          f"peak resident memory growth per rank ({machine['machine']}, {machine['cpus']} cores, torch "
          f"{machine['torch']}, gloo)")
    for way, ranks in result["ways"].items():
        print(f"  {way}: " + ", ".join(f"{rank} {r['peak_growth_bytes'] / 2**20:.0f} MiB in {r['seconds']:.2f} s"
                                         for rank, r in ranks.items()))
    print("  ratio chunked / whole: " + ", ".join(f"{rank} {v:.2f}x" for rank, v in
                                                    result["ratio_chunked_vs_whole"].items()))
    out = HERE / "results" / "checkpoint_broadcast.json"
    out.write_text(json.dumps({"date": date.today().isoformat(), "machine": machine, "mib": args.mib, **result},
                              indent=2) + "\n")
    print(f"written: {out}")


if __name__ == "__main__":
    main()
