"""What the dry run prints and what a run writes about itself: verdict, plan table, plan file."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from runner.plan.processes import Plan
from runner.spec.batch import BatchSplit
from runner.spec.elastic import elasticity, world_size_range
from runner.spec.place import RankPlace
from runner.spec.schema import DeviceKind, recipe_settings

SHOWN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
             "CUDA_VISIBLE_DEVICES", "GLOO_SOCKET_IFNAME")
TABLE_HEAD = 16  # rows shown at each end of a long plan; plan.json has them all


def verdict(plan: Plan) -> str:
    job = plan.job
    spec = job.spec
    counts = "+".join(str(n) for n in plan.processes_per_host)
    return (f"valid: {plan.world_size} process(es) on {len(job.hosts)} host(s) ({counts}); "
            f"device {job.device.value}, backend {job.backend.value}, init {spec.init.method.value} "
            f"({plan.init_method}), {spec.parallel.mode.value}, sharding {spec.sharding.mode.value}, "
            f"launcher {spec.launcher.kind} ({spec.launcher.tasks.value})"
            + ("; preflight: each host's checks and one all-reduce, no recipe" if spec.preflight else ""))


def batch_line(plan: Plan) -> str | None:
    """How the recipe's global batch is split: "batch: 64 over 3 processes: 22, 21, 21", and, for a job that outlives
    its hosts, the split at its fewest processes; None where the recipe has no global batch (recipe=script)."""
    job = plan.job
    recipe = recipe_settings(job.spec.recipe)
    if not isinstance(recipe.global_batch_size, int) or recipe.global_batch_size < plan.world_size:
        return None
    micro = recipe.micro_batch_size if isinstance(recipe.micro_batch_size, int) else None
    line = f"batch: {BatchSplit(recipe.global_batch_size, plan.world_size, micro).describe()}"
    elastic = elasticity(job)
    fewest, _ = world_size_range(job, elastic)
    if fewest < plan.world_size:
        line += (f"\n       with hosts lost, down to topology.min_nodes={elastic.min_nodes}: "
                 f"{BatchSplit(recipe.global_batch_size, fewest, micro).describe()}")
    return line


def _row(plan: Plan, r: RankPlace, cuda: bool) -> list[str]:
    env = plan.env(r)
    shown = " ".join(f"{k}={env[k]}" for k in SHOWN_ENV if k in env)
    return [str(r.global_rank), str(r.node_rank), str(r.local_rank), r.host, r.device if not cuda or len(r.device_ids) < 2
            else f"{r.device} (DP over {len(r.device_ids)})", shown]


def plan_table(plan: Plan) -> str:
    cuda = plan.job.device is DeviceKind.cuda
    records = plan.records
    skipped = 0
    if len(records) > 2 * TABLE_HEAD + 1:
        skipped = len(records) - 2 * TABLE_HEAD
        records = records[:TABLE_HEAD] + records[-TABLE_HEAD:]
    rows = [["rank", "node", "local", "host", "device", "environment"]]
    rows += [_row(plan, r, cuda) for r in records]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = []
    for n, row in enumerate(rows):
        lines.append("  ".join([*(c.rjust(w) if i < 3 else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))), row[5]]).rstrip())
        if skipped and n == TABLE_HEAD:
            lines.append(f"  ... {skipped} more processes (every one is in plan.json) ...")
    return "\n".join(lines)


def plan_document(plan: Plan) -> dict:
    job = plan.job
    return {
        "world_size": plan.world_size,
        "device": job.device.value,
        "backend": job.backend.value,
        "master_addr": plan.master_addr,
        "master_port": plan.master_port,
        "init_method": plan.init_method,
        "hosts": [{"node_rank": h.index, "host": h.label, "addr": h.reach, "devices": h.devices, "gpus": list(h.gpus)}
                  for h in job.hosts],
        "processes": [{**_process(r), "env": plan.env(r)} for r in plan.records],
    }


def _process(place: RankPlace) -> dict:
    """A process's entry of plan.json: its place, less the world size the document gives once."""
    return {k: v for k, v in asdict(place).items() if k != "world_size"}


def write_plan(plan: Plan, path: Path) -> None:
    with open(path, "w") as f:
        json.dump(plan_document(plan), f)
