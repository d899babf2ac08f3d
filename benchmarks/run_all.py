"""The whole benchmark suite, one command: ``.venv/bin/python benchmarks/run_all.py``.

Runs each benchmark in its own process, one after the other (each measures its figures against its
references in the same run), then prints the headline ratios and writes them, with the date and the
machine, to benchmarks/results/suite.json, and the tables of benchmarks/REPORT.md from the result
files. ``--quick`` runs fewer repetitions (a smoke test of the suite, not figures to quote; the report
is left alone).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def _run(script: str, *args: str) -> float:
    started = time.monotonic()
    print(f"\n=== {script} {' '.join(args)}", flush=True)
    subprocess.run([sys.executable, str(HERE / script), *args], check=True, cwd=HERE.parent)
    return time.monotonic() - started


def _machine() -> dict[str, object]:
    import torch

    return {"platform": platform.platform(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.cuda.is_available()}


def headline() -> list[tuple[str, str]]:
    """(figure, value) pairs from the benchmarks' result files."""
    rows: list[tuple[str, str]] = []
    launch = json.loads((RESULTS / "launch_speed.json").read_text())
    for size, r in sorted(launch.get("launch", {}).items(), key=lambda kv: int(kv[0])):
        rows.append((f"`run` whole-command time, {size} processes, vs torchrun --standalone",
                     f"{r['ratio_vs_torchrun']['run (recipe)']:.2f}x ({r['median_s']['run (recipe)']:.2f} s vs "
                     f"{r['median_s']['torchrun --standalone']:.2f} s)"))
        rows.append((f"... vs a bare torch.multiprocessing script, {size} processes",
                     f"{r['ratio_vs_mp_spawn']['run (recipe)']:.2f}x"))
        rows.append((f"... vs the floor (import torch + rendezvous), {size} processes",
                     f"{r['ratio_vs_floor']['run (recipe)']:.2f}x"))
    for size, r in sorted(launch.get("throughput", {}).items(), key=lambda kv: int(kv[0])):
        rows.append((f"training throughput vs a hand-written DDP loop, {size} processes", f"{r['ratio']:.3f}x"))
    pairs = json.loads((RESULTS / "torchrun_pairs.json").read_text())
    for size, r in sorted(pairs["results"].items(), key=lambda kv: int(kv[0])):
        rows.append((f"`run -- tiny.py` vs `torchrun --standalone tiny.py`, {size} processes, paired",
                     f"{r['ratio_run_vs_torchrun']:.2f}x ({r['median_s']['run --']:.2f} s vs "
                     f"{r['median_s']['torchrun --standalone']:.2f} s); teardown aborts: run "
                     f"{r['teardown_aborts']['run --']} of {r['runs']}, torchrun "
                     f"{r['teardown_aborts']['torchrun --standalone']} of {r['runs']}; hangs: run "
                     f"{r['hangs']['run --']}, torchrun {r['hangs']['torchrun --standalone']}"))
    diagnosis = json.loads((RESULTS / "diagnosis_overhead.json").read_text())
    for size, r in sorted(diagnosis["results"].items(), key=lambda kv: int(kv[0])):
        rows.append((f"throughput recording collectives vs not (log.collectives=200 vs 0), {size} processes",
                     f"{r['ratio']:.3f}x"))
    plan = json.loads((RESULTS / "plan_scale.json").read_text())
    for row in plan["rows"]:
        if row["processes"] == max(r["processes"] for r in plan["rows"]):
            rows.append((f"validation + plan, {row['hosts']:,} hosts x {row['devices_per_host']} ({row['form']})",
                         f"{row['seconds']:.2f} s ({row['us_per_process']:.2f} us/process, "
                         f"{row['ratio_vs_1000']:.2f}x the per-process time at 1,000 hosts)"))
    sharding = json.loads((RESULTS / "sharding_memory.json").read_text())
    for shape, r in sharding["results"].items():
        none = r["modes"]["none"]["optimizer_state_bytes"]
        ratios = ", ".join(f"{mode} {m['optimizer_state_bytes'] / none:.2f}x" for mode, m in r["modes"].items()
                           if mode != "none")
        rows.append((f"optimizer state per process vs sharding=none, {shape}", ratios))
    checkpoint = json.loads((RESULTS / "checkpoint_broadcast.json").read_text())
    whole, chunked = (checkpoint["ways"][way] for way in checkpoint["ways"])
    rows.append((f"peak memory growth per rank receiving a {checkpoint['file_bytes'] / 2**20:,.0f} MiB checkpoint, "
                 f"64 MiB chunks vs one pickled object",
                 ", ".join(f"{rank} {ratio:.2f}x ({chunked[rank]['peak_growth_bytes'] / 2**20:,.0f} MiB vs "
                           f"{whole[rank]['peak_growth_bytes'] / 2**20:,.0f} MiB)"
                           for rank, ratio in checkpoint["ratio_chunked_vs_whole"].items())))
    copies = json.loads((RESULTS / "checkpoint_copies.json").read_text())
    for size in copies["sizes"]:
        ways = size["ways"]
        rows.append((f"a save that keeps every host's copy of a {size['mib']:,} MiB checkpoint, vs rank 0's local save",
                     f"{size['ratio_copies_vs_local']:.2f}x ({ways['copies']['rank0']['seconds']:.1f} s vs "
                     f"{ways['local']['rank0']['seconds']:.1f} s); the receiving rank's peak memory growth "
                     f"{ways['copies']['rank1']['peak_growth_bytes'] / 2**20:,.0f} MiB"))
    restarts = json.loads((RESULTS / "restart_across_hosts.json").read_text())
    ran = next(r for name, r in restarts["results"].items() if name.startswith("run"))
    for ref, ratio in restarts["ratio_run_vs"].items():
        other = restarts["results"][ref]
        rows.append((f"a restart across 2 hosts, both hosts' first step of attempt 2, run vs {ref}",
                     f"{ratio['both_restarted_s']:.2f}x ({ran['median_s']['both_restarted_s']:.2f} s vs "
                     f"{other['median_s']['both_restarted_s']:.2f} s); restarted {ran['restarted']} vs "
                     f"{other['restarted']} of {other['trials']}; host 0 names the killed rank {ran['names_cause']} vs "
                     f"{other['names_cause']}"))
    lost = json.loads((RESULTS / "lost_hosts.json").read_text())
    for fault, row in lost["results"].items():
        cells = [f"{name.split()[0]} finished {r['finished']} of {r['trials']}"
                 + ("" if r["median_recovered_s"] is None else f", first step {r['median_recovered_s']:.1f} s after")
                 for name, r in row.items() if name != "ratio_run_vs_torchrun"]
        rows.append((f"a lost host ({fault}), 3 hosts, run topology.min_nodes=2 vs torchrun --nnodes=2:3",
                     "; ".join(cells)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions: check the suite runs")
    parser.add_argument("--only", nargs="+", choices=["launch_speed", "torchrun_pairs", "diagnosis_overhead", "plan_scale",
                                                      "sharding_memory", "checkpoint_broadcast", "checkpoint_copies",
                                                      "restart_across_hosts",
                                                      "zygote_preload", "lost_hosts"],
                        help="run these benchmarks only; the summary also reads the others' last result files")
    args = parser.parse_args()
    quick = {"launch_speed": ["--reps", "1", "--steps", "200"], "torchrun_pairs": ["--pairs", "1"],
             "diagnosis_overhead": ["--reps", "1", "--steps", "200"],
             "plan_scale": ["--repeat", "1"], "sharding_memory": ["--steps", "5"], "checkpoint_broadcast": ["--mib", "128"],
             "checkpoint_copies": ["--mib", "128"],
             "restart_across_hosts": ["--rounds", "1"], "zygote_preload": ["--runs", "2"], "lost_hosts": ["--rounds", "1"]}
    names = list(args.only or quick)
    for bed in ("restart_across_hosts", "lost_hosts"):  # their hosts are network namespaces
        if os.geteuid() != 0 and bed in names:
            print(f"{bed}.py needs root (scripts/testbed.py): left out, its last results stand")
            names.remove(bed)
    took = {f"{name}.py": _run(f"{name}.py", *(quick[name] if args.quick else [])) for name in names}
    rows = headline()
    suite = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": _machine(), "quick": args.quick,
             "seconds": {k: round(v, 1) for k, v in took.items()}, "headline": dict(rows)}
    (RESULTS / "suite.json").write_text(json.dumps(suite, indent=2) + "\n")
    width = max(len(k) for k, _ in rows)
    print(f"\n=== suite, {suite['date']}, {suite['machine']['platform']}, {suite['machine']['cpus']} CPUs, "
          f"torch {suite['machine']['torch']}" + (" (--quick: not figures to quote)" if args.quick else ""))
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    print(f"\nwritten: {RESULTS / 'suite.json'} (and each benchmark's own file there)")
    if not args.quick:  # figures to quote: the report's tables become this run's
        import report

        print(f"rewrote the tables ({', '.join(report.update())}) of {report.REPORT}")


if __name__ == "__main__":
    main()
