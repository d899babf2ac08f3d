"""What each module the zygote (runner.worker.zygote) could import before it forks the ranks buys, what it costs, and
whether the ranks still end.

    .venv/bin/python benchmarks/zygote_preload.py [--runs 12]

For each candidate, measured here in fresh processes that imported torch first, as the zygote does:

* its cost: the CPU time of importing it in the zygote, before any rank can start (on the launch's critical path);
* what it saves every rank: the CPU time a rank then no longer spends importing what an everyday script imports
  (``torch._dynamo``, which the first optimizer and DDP import, and the runner's own rank code);
* the ranks' ends: ``--runs`` jobs of 2 ranks forked (as the zygote forks them, their random streams reseeded) from a
  process that imported torch and the candidate, each running benchmarks/workloads/tiny_ddp.py (DDP, SGD, 20 steps,
  destroy_process_group(), return); a job whose ranks have not all ended ``HANG_S`` after its start is a hang.

The zygote imports torch and the runner's rank code, and not ``torch._dynamo``: pre-imported, it saves each rank
about a second of CPU, and ranks hang at their end (torch's race in ~ProcessGroupGloo; a script that imports it first
hangs the same way under torchrun). Results: benchmarks/results/zygote_preload.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import result_file

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "workloads" / "tiny_ddp.py"
HANG_S = 20.0
CANDIDATES = {
    "nothing more": (),
    "the runner's rank code (runner.worker.rank, runner.worker.script)": ("runner.worker.rank", "runner.worker.script"),
    "sympy": ("sympy",),
    "torch.fx.experimental.symbolic_shapes (sympy with it)": ("torch.fx.experimental.symbolic_shapes",),
    "torch._dynamo": ("torch._dynamo",),
}
WHAT_A_RANK_IMPORTS = ("torch._dynamo", "runner.worker.rank", "runner.worker.script")

_COST = """
import importlib, json, sys, time
import torch
start = time.process_time()
for name in sys.argv[1:]:
    importlib.import_module(name)
preloaded = time.process_time()
for name in {rank!r}:
    importlib.import_module(name)
print(json.dumps([preloaded - start, time.process_time() - preloaded]))
"""

_FORKS = """
import importlib, json, os, runpy, socket, sys, time
import torch, torch.distributed
for name in sys.argv[3:]:
    importlib.import_module(name)
script, hang_s = sys.argv[1], float(sys.argv[2])
sock = socket.socket(); sock.bind(("127.0.0.1", 0)); port = sock.getsockname()[1]; sock.close()
pids = []
for rank in range(2):
    pid = os.fork()
    if pid == 0:
        torch.default_generator.seed()
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
        sys.argv = [script]
        code = 0
        try:
            runpy.run_path(script, run_name="__main__")
        except BaseException:
            code = 1
        os._exit(code)
    pids.append(pid)
deadline, left = time.monotonic() + hang_s, set(pids)
while left and time.monotonic() < deadline:
    for pid in list(left):
        if os.waitpid(pid, os.WNOHANG)[0]:
            left.discard(pid)
    time.sleep(0.05)
for pid in left:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
print(json.dumps(bool(left)))
"""


def measure(modules: tuple[str, ...], runs: int) -> dict:
    cost, rank_imports = json.loads(subprocess.run(
        [sys.executable, "-c", _COST.format(rank=WHAT_A_RANK_IMPORTS), *modules], capture_output=True, text=True,
        check=True).stdout)
    hangs = sum(json.loads(subprocess.run([sys.executable, "-c", _FORKS, str(SCRIPT), str(HANG_S), *modules],
                                          capture_output=True, text=True, check=True, cwd=HERE).stdout)
                for _ in range(runs))
    return {"modules": list(modules), "zygote_cpu_s": round(cost, 3), "rank_imports_cpu_s": round(rank_imports, 3),
            "runs": runs, "hangs": hangs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=12)
    args = parser.parse_args()
    results = {name: measure(modules, args.runs) for name, modules in CANDIDATES.items()}
    base = results["nothing more"]["rank_imports_cpu_s"]
    for name, r in results.items():
        r["saves_every_rank_cpu_s"] = round(base - r["rank_imports_cpu_s"], 3)
    out = result_file.write("zygote_preload", runs=args.runs, results=results)
    for name, r in results.items():
        print(f"{name}: costs the zygote {r['zygote_cpu_s']:.2f} CPU-s, saves every rank {r['saves_every_rank_cpu_s']:.2f} "
              f"CPU-s; {r['hangs']} of {r['runs']} jobs hung at their end")
    print(f"written: {out}")


if __name__ == "__main__":
    main()
