"""How validation + planning scale with the number of hosts.

    python benchmarks/plan_scale.py            # the table, a PASS/FAIL line, benchmarks/results/plan_scale.json
    python benchmarks/plan_scale.py --extras   # also time the dry run's other per-host work (request, verdict)

For 1,000 / 2,500 / 5,000 / 10,000 hosts x 8 devices, written both as the grid shorthand
(topology.nodes x devices_per_node) and as an explicit list of named hosts, it times
``runner.launchers.validate(spec, FixedProbe())`` followed by ``runner.launchers.plan_for(job)`` (best of several repetitions,
time.perf_counter) and prints seconds, microseconds per process, and the time per process relative
to the 1,000-host case of the same form measured in the same run: linear growth gives a ratio of
about 1, quadratic growth a ratio that rises with the size.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runner.environments.process import ProcessEnvironment  # noqa: E402
from runner.launchers import LAUNCHERS  # noqa: E402
from runner.launchers.base import Invocation  # noqa: E402
from runner.plan.processes import make_plan  # noqa: E402
from runner.plan.render import verdict  # noqa: E402
from runner.records.paths import RunPaths  # noqa: E402
from runner.spec.probe import FixedProbe  # noqa: E402
from runner.spec.schema import (  # noqa: E402
    BackendConfig,
    DeviceKind,
    HostConfig,
    InitConfig,
    JobConfig,
    LauncherConfig,
    ParallelConfig,
    RecipeConfig,
    ShardingConfig,
    TaskMode,
    TopologyConfig,
)
from runner.launchers import validate  # noqa: E402

SIZES = (1_000, 2_500, 5_000, 10_000)
DEVICES = 8
REFERENCE = SIZES[0]
BUDGET_S = 1.0  # 10,000 x 8 must validate and plan in under a second
RESULTS = ROOT / "benchmarks" / "results" / "plan_scale.json"


def make_spec(hosts: int, form: str) -> JobConfig:
    if form == "grid":
        topology = TopologyConfig(nodes=hosts, devices_per_node=DEVICES)
    else:
        topology = TopologyConfig(hosts=[HostConfig(name=f"gpu{i:05d}.cluster.example", devices=DEVICES)
                                         for i in range(hosts)])
    return JobConfig(
        topology=topology,
        init=InitConfig(),
        launcher=LauncherConfig(kind="slurm", tasks=TaskMode.per_device),
        backend=BackendConfig(),
        parallel=ParallelConfig(),
        sharding=ShardingConfig(),
        recipe=RecipeConfig(target="runner.recipes.digits:main", global_batch_size=hosts * DEVICES * 4),
        device=DeviceKind.cuda,
    )


def best_of(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        try:
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        finally:
            gc.enable()
    return best


def validate_and_plan(spec: JobConfig):
    job, problems = validate(spec, FixedProbe())
    assert job is not None, "\n".join(p.render() for p in problems)
    paths = RunPaths(Path("/runs/R1"), "R1")
    return make_plan(job, LAUNCHERS[spec.launcher.kind].launch_rules(job, paths), paths)


def measure(repeat: int) -> list[dict]:
    rows = []
    for form in ("grid", "named"):
        for hosts in SIZES:
            spec = make_spec(hosts, form)
            plan = validate_and_plan(spec)  # warm-up, and the process count
            processes = plan.world_size
            assert processes == hosts * DEVICES
            seconds = best_of(lambda: validate_and_plan(spec), repeat)
            rows.append({"form": form, "hosts": hosts, "devices_per_host": DEVICES, "processes": processes,
                         "seconds": seconds, "us_per_process": seconds / processes * 1e6})
    for row in rows:
        ref = next(r for r in rows if r["form"] == row["form"] and r["hosts"] == REFERENCE)
        row["ratio_vs_1000"] = row["us_per_process"] / ref["us_per_process"]
    return rows


def measure_extras(repeat: int) -> list[dict]:
    """The rest of a dry run's per-host work, at sizes small enough to finish (it is not part of PASS/FAIL)."""
    rows = []
    paths = RunPaths(Path("/runs/R1"), "R1")
    invocation = Invocation(python=sys.executable, cwd=str(ROOT))
    for hosts in (250, 500, 1_000, 2_000):
        plan = validate_and_plan(make_spec(hosts, "grid"))
        launcher = LAUNCHERS["slurm"](plan=plan, paths=paths, invocation=invocation, environment=ProcessEnvironment.read({}))
        for what, fn in (("slurm request()", launcher.request), ("report.verdict()", lambda: verdict(plan))):
            seconds = best_of(fn, repeat)
            rows.append({"what": what, "hosts": hosts, "processes": plan.world_size, "seconds": seconds,
                         "us_per_process": seconds / plan.world_size * 1e6})
    for row in rows:
        ref = next(r for r in rows if r["what"] == row["what"] and r["hosts"] == 250)
        row["ratio_vs_250"] = row["us_per_process"] / ref["us_per_process"]
    return rows


def table(rows: list[dict]) -> str:
    head = f"{'form':<6} {'hosts':>7} {'processes':>10} {'seconds':>9} {'us/process':>11} {'ratio vs 1,000':>15}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['form']:<6} {r['hosts']:>7,} {r['processes']:>10,} {r['seconds']:>9.4f} "
                     f"{r['us_per_process']:>11.3f} {r['ratio_vs_1000']:>15.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="repetitions per size; the best one counts")
    parser.add_argument("--extras", action="store_true", help="also time the launcher request and the verdict")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    rows = measure(args.repeat)
    print("validate(spec, FixedProbe()) + plan_for(job), best of", args.repeat)
    print(table(rows))
    largest = [r for r in rows if r["hosts"] == SIZES[-1]]
    worst = max(r["seconds"] for r in largest)
    passed = worst < BUDGET_S
    print(f"\n{'PASS' if passed else 'FAIL'}: {SIZES[-1]:,} x {DEVICES} under {BUDGET_S:g} s "
          f"(slowest form: {worst:.3f} s; " + ", ".join(f"{r['form']} {r['seconds']:.3f} s" for r in largest) + ")")

    result = {
        "benchmark": "check + make_plan",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "repeat": args.repeat,
        "reference_hosts": REFERENCE,
        "budget_s": BUDGET_S,
        "passed": passed,
        "rows": rows,
    }
    if args.extras:
        extras = measure_extras(max(1, args.repeat // 2))
        print("\nnot part of PASS/FAIL: the rest of a dry run, per host")
        for r in extras:
            print(f"{r['what']:<18} {r['hosts']:>6,} hosts {r['seconds']:>9.4f} s {r['us_per_process']:>10.3f} us/process "
                  f"ratio vs 250 hosts {r['ratio_vs_250']:>6.2f}")
        result["extras"] = extras
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.output.relative_to(ROOT) if args.output.is_relative_to(ROOT) else args.output}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
