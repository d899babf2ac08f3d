"""The tables of benchmarks/REPORT.md, made from the result files of the last run.

REPORT.md keeps its prose; each table sits between ``<!-- table:NAME -->`` and ``<!-- end -->`` and is
written anew by ``run_all.py`` after a full run (or ``python benchmarks/report.py`` by hand), so the
report never quotes figures its result files do not hold.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
REPORT = HERE / "REPORT.md"
_BLOCK = re.compile(r"(<!-- table:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end -->)", re.S)


def _load(name: str) -> dict:
    return json.loads((RESULTS / f"{name}.json").read_text())


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def machine() -> str:
    suite = _load("suite")
    m = suite["machine"]
    return (f"{m['machine']}, {m['cpus']} cores, Python {m['python']}, torch {m['torch']}, gloo; "
            f"measured {suite['date']}")


def launch() -> str:
    data = _load("launch_speed")
    out = []
    for size, r in sorted(data["launch"].items(), key=lambda kv: int(kv[0])):
        rows = [[name, f"{r['median_s'][name]:.2f}", f"{r['ratio_vs_torchrun'][name]:.2f}",
                 f"{r['ratio_vs_mp_spawn'][name]:.2f}", f"{r['ratio_vs_floor'][name]:.2f}"] for name in r["median_s"]]
        out.append(f"**{size} processes**\n\n" + _table(["command", "seconds", "× torchrun --standalone", "× mp.spawn",
                                                          "× floor"], rows))
    return "\n".join(out)


def throughput() -> str:
    data = _load("launch_speed")
    rows = []
    for size, r in sorted(data["throughput"].items(), key=lambda kv: int(kv[0])):
        run, ref = r["median_steps_per_s"]["run"], r["median_steps_per_s"]["hand-written mp DDP"]
        rows.append([size, f"{run:.1f}", f"{ref:.1f}", f"{r['ratio']:.3f}"])
    return _table(["processes", "run", "hand-written torch.multiprocessing DDP", "ratio"], rows)


def plan() -> str:
    rows = [[r["form"], f"{r['hosts']:,}", f"{r['processes']:,}", f"{r['seconds']:.3f}", f"{r['us_per_process']:.2f}",
             f"{r['ratio_vs_1000']:.2f}"] for r in _load("plan_scale")["rows"]]
    return _table(["form", "hosts", "processes", "seconds", "µs/process", "× per-process time at 1,000 hosts"], rows)


def sharding() -> str:
    rows = []
    for shape, r in _load("sharding_memory")["results"].items():
        for mode, m in r["modes"].items():
            if mode == "none":
                continue
            ratio = m["ratio_vs_none"]
            rows.append([shape, mode, f"{ratio['optimizer_state_bytes']:.2f}", f"{ratio['peak_bytes']:.2f}",
                         f"{ratio['step_s']:.2f}"])
    return _table(["shape", "mode", "optimizer state / process", "peak tensor memory", "step time"], rows)


def diagnosis() -> str:
    rows = []
    for size, r in sorted(_load("diagnosis_overhead")["results"].items(), key=lambda kv: int(kv[0])):
        med = r["median_steps_per_s"]
        rows.append([size, f"{med['recording (log.collectives=200)']:.1f}", f"{med['not recording (log.collectives=0)']:.1f}",
                     f"{r['ratio']:.3f}"])
    return _table(["processes", "recording (log.collectives=200)", "not recording (log.collectives=0)", "ratio"], rows)


def pairs() -> str:
    data = _load("torchrun_pairs")
    rows = []
    for size, r in sorted(data["results"].items(), key=lambda kv: int(kv[0])):
        med, aborts, hangs, failed = r["median_s"], r["teardown_aborts"], r["hangs"], r["failed"]
        other = {name: failed[name] - aborts[name] - hangs[name] for name in failed}
        rows.append([size, str(r["runs"]), f"{med['run --']:.2f}", f"{med['torchrun --standalone']:.2f}",
                     f"{r['ratio_run_vs_torchrun']:.2f}", f"{aborts['run --']} / {aborts['torchrun --standalone']}",
                     f"{hangs['run --']} / {hangs['torchrun --standalone']}",
                     f"{other['run --']} / {other['torchrun --standalone']}"])
    m = data["machine"]
    return (f"measured {data['date']}, {m['cpus']} CPUs, Python {m['python']}, torch {m['torch']}\n\n"
            + _table(["processes", "pairs", "run -- (s)", "torchrun --standalone (s)", "ratio",
                      "teardown aborts (run / torchrun)", "hangs (run / torchrun)", "other failures (run / torchrun)"],
                     rows))


def checkpoint() -> str:
    data = _load("checkpoint_broadcast")
    ratio = data["ratio_chunked_vs_whole"]
    rows = [[way, rank[-1], f"{r['peak_growth_bytes'] / 2**20:,.0f}", f"{r['seconds']:.2f}",
             f"{ratio[rank]:.2f}" if i else "1.00"]
            for i, (way, ranks) in enumerate(data["ways"].items()) for rank, r in ranks.items()]
    m = data["machine"]
    return (f"measured {data['date']}, a {data['file_bytes'] / 2**20:,.0f} MiB checkpoint, {m['cpus']} CPUs, torch "
            f"{m['torch']}, gloo\n\n" + _table(["how rank 0 sends it", "rank", "peak memory growth (MiB)", "seconds",
                                                "× one pickled object"], rows))


def copies() -> str:
    data = _load("checkpoint_copies")
    rows = [[f"{size['mib']:,}", way, f"{r['rank0']['seconds']:.2f}", f"{r['rank1']['peak_growth_bytes'] / 2**20:,.0f}",
             f"{size['ratio_copies_vs_local']:.2f}" if way == "copies" else "1.00"]
            for size in data["sizes"] for way, r in size["ways"].items()]
    m = data["machine"]
    return (f"measured {data['date']}, {m['cpus']} CPUs, torch {m['torch']}, gloo\n\n"
            + _table(["checkpoint (MiB)", "save", "seconds the save held rank 0", "rank 1's peak memory growth (MiB)",
                      "× the local save"], rows))


def _clip(line: str | None, most: int = 160) -> str:
    return "none" if line is None else f"`` {line[:most]} ``" + ("…" if len(line) > most else "")


def restarts() -> str:
    data = _load("restart_across_hosts")
    results, ratios = data["results"], data["ratio_run_vs"]
    rows, said = [], []
    for name, r in results.items():
        med = r["median_s"]
        ratio = ratios.get(name)
        rows.append([name, str(r["trials"]), f"{r['restarted']}, {r['both_exit_0']}",
                     "—" if med["survivor_gone_s"] is None else f"{med['survivor_gone_s']:.2f}",
                     "—" if med["both_restarted_s"] is None else f"{med['both_restarted_s']:.2f}",
                     f"{ratio['survivor_gone_s']:.2f} / {ratio['both_restarted_s']:.2f}" if ratio else "—",
                     f"{r['names_cause']} of {r['trials']}"])
        said.append(f"- {name}: first line about the failure {_clip(r['host0_first_failure_line'])}; naming the "
                    f"killed rank: {_clip(r['host0_cause_line'])}")
    m = data["machine"]
    load = ", ".join(f"{x:.1f}" for x in data["load_before"])
    return (f"measured {data['date']}, {m['cpus']} CPUs shared with other work (load average {load} at the start), "
            f"torch {m['torch']}, gloo; host 1's worker killed at step {data['kill_at_step']}\n\n"
            + _table(["launcher", "trials", "restarted, both hosts exit 0", "host 0's worker gone after the kill (s)",
                      "both hosts' first step of attempt 2 after the kill (s)", "run × this: gone / first step",
                      "host 0 names the killed rank and SIGKILL"], rows)
            + "\nWhat host 0's output says (of the first trial):\n\n" + "\n".join(said) + "\n")


LOST_FAULTS = {"kill": "host 2's processes killed", "link": "host 2's link down (no FIN)",
               "host 0": "host 0's processes killed",
               "back": "host 2 lost, then back",
               "late": "host 2 started late (`run`: a spare)"}  # benchmarks/lost_hosts.py's faults, in words


def lost_host_cell(r: dict | None, fault: str = "") -> str:
    """One launcher's trials of one fault, in words (docs/lost-hosts.md and this report); None: not tried (a launcher
    that takes no host back)."""
    if r is None:
        return "takes no host back (refused: topology.max_nodes)"
    after = {"back": "after its return", "late": "after its start"}.get(fault, "after the fault")
    first = "" if r["median_recovered_s"] is None else f", first step {r['median_recovered_s']:.1f} s {after}"
    if "grew" in r:
        grew = "grew back" if fault == "back" else "grew to 3 hosts"
        lost = "" if r["median_steps_lost"] is None else f", {r['median_steps_lost']:g} step(s) lost"
        first = f", {grew} ({r['grew']} of {r['trials']}){first}{lost}" if r["grew"] else \
            f", did not {grew.replace('grew', 'grow')} (0 of {r['trials']})"
    if r["finished"] == 0:
        return f"did not finish (0 of {r['trials']}){first if 'grew' in r else ''}"
    return f"finished ({r['finished']} of {r['trials']}){first}"


def lost_hosts() -> str:
    data = _load("lost_hosts")
    rows = []
    for fault, row in data["results"].items():
        ssh, manual, torchrun = lost_host_launchers(row)
        ratios = [row[key] for key in ("ratio_run_vs_torchrun", "ratio_manual_vs_torchrun")]
        rows.append([LOST_FAULTS[fault], lost_host_cell(ssh, fault), lost_host_cell(manual, fault),
                     lost_host_cell(torchrun, fault),
                     *(f"{ratio:.2f}" if ratio else "—" for ratio in ratios)])
    m = data["machine"]
    back = f"; host 2 back once the two did step {data['back_at_step']} of {data['back_steps']}" \
        if "back" in data["results"] else ""
    back += f"; host 2 started late once the two did step {data['late_at_step']} of {data['back_steps']}" \
        if "late" in data["results"] else ""
    return (f"measured {data['date']}, {m['cpus']} CPUs, torch {m['torch']}, gloo; three hosts of one process, the fault "
            f"once rank 0 did step {data['fault_at_step']} of {data['steps']}{back}\n\n"
            + _table(["fault", "`run` launcher=ssh", "`run` launcher=manual", "torchrun --nnodes=2:3",
                      "ssh × torchrun, first step", "manual × torchrun"], rows))


def lost_host_launchers(row: dict) -> tuple[dict, dict | None, dict]:
    """One fault's trials under `run` launcher=ssh, `run` launcher=manual (None: not tried) and torchrun
    (topology.min_nodes=2 and --nnodes=2:3)."""
    return (next(r for name, r in row.items() if name.startswith("run launcher=ssh")),
            next((r for name, r in row.items() if name.startswith("run launcher=manual")), None),
            next(r for name, r in row.items() if name.startswith("torchrun")))


def preload() -> str:
    data = _load("zygote_preload")
    rows = [[name, f"{r['zygote_cpu_s']:.2f}", f"{r['saves_every_rank_cpu_s']:.2f}", f"{r['hangs']} of {r['runs']}"]
            for name, r in data["results"].items()]
    m = data["machine"]
    return (f"measured {data['date']}, {m['cpus']} CPUs, Python {m['python']}, torch {m['torch']}\n\n"
            + _table(["imported before the fork (after torch)", "costs the zygote (CPU-s)", "saves every rank (CPU-s)",
                      "jobs that hung at their end"], rows))


def gpu(path: Path | None = None) -> str:
    """The GPU run's checks (benchmarks/gpu_checks.py); where none ran on a GPU, says so and how to run them."""
    path = path or RESULTS / "gpu_checks.json"
    data = json.loads(path.read_text()) if path.exists() else None
    if data is None or not data["cuda"]:
        tried = f" (the script's last run, {data['date']}, had no CUDA: every check skipped)" if data else ""
        return f"No GPU run is recorded yet{tried}. On a GPU machine: `bash scripts/gpu_checks.sh`.\n"
    d = data["device"]
    rows = [[r["check"], r["status"], f"{r.get('seconds', 0):.1f}", _gpu_figures(r)] for r in data["checks"]]
    return (f"measured {data['date']} with `{data['command']}`: {d['gpus']} x {d['name']}, driver {d['driver']}, "
            f"torch {d['torch']}, CUDA {d['cuda']}, Python {d['python']}, {d['cpus']} CPUs\n\n"
            + _table(["check", "status", "seconds", "figures"], rows))


def _gpu_figures(record: dict) -> str:
    """A check's figures in one cell: the throughput's and launch's ratios in words, the others as they came."""
    figures = record.get("figures")
    if figures is None:
        return record.get("why", "").splitlines()[0][:160] if record.get("why") else ""
    if "ratio" in figures and "median_steps_per_s" in figures:
        med = figures["median_steps_per_s"]
        return (f"run {med['run']:.2f} steps/s vs hand-written {med['hand-written loop']:.2f}: "
                f"**{figures['ratio']:.3f}x** (target {figures['target']})")
    if all(isinstance(v, dict) and "ratio" in v for v in figures.values()):
        return "; ".join(f"{n} process(es): run {v['median_s']['run --']:.2f} s vs torchrun "
                         f"{v['median_s']['torchrun --standalone']:.2f} s = **{v['ratio']:.2f}x**"
                         for n, v in figures.items())
    return json.dumps(figures)[:200].replace("|", "/")


TABLES = {"machine": lambda: machine() + "\n", "launch": launch, "throughput": throughput, "plan": plan,
          "sharding": sharding, "diagnosis": diagnosis, "pairs": pairs, "checkpoint": checkpoint, "copies": copies,
          "restarts": restarts,
          "preload": preload, "lost_hosts": lost_hosts, "gpu": gpu}


def update(report: Path = REPORT, names: set[str] | None = None) -> list[str]:
    """Rewrite every table block of the report (or those of ``names``) from the result files; the names of those
    rewritten."""
    text, done = report.read_text(), []

    def fill(m: re.Match) -> str:
        if names is not None and m["name"] not in names:
            return m.group(0)
        done.append(m["name"])
        return m.group(1) + TABLES[m["name"]]() + m.group(4)

    report.write_text(_BLOCK.sub(fill, text))
    return done


if __name__ == "__main__":
    print(f"{REPORT}: rewrote {', '.join(update())}")
