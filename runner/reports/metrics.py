"""What a run's recipe measured, as the reports read it: the rows of ``metrics.jsonl`` (ctx.log, rank 0) and
what the recipe returned (rank 0's done file, runner.records.outcomes), which wins where both have a value."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from runner.records.outcomes import RankOutcome
from runner.records.paths import RunPaths

THROUGHPUT = "samples_per_s"  # the column a sweep's scaling is measured by


def _numbers(row: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
            and k not in ("step", "time_s")}


@dataclass(frozen=True)
class RunMetrics:
    step: int | None = None  # the step of the last row
    final: dict[str, float] = field(default_factory=dict)  # the numbers of the last row, then the recipe's result
    throughput: float | None = None  # the last samples_per_s logged


def read_metrics(paths: RunPaths) -> RunMetrics:
    """The run's final metrics: metrics.jsonl's last row (its row marked ``final`` when there is one),
    updated with what rank 0's recipe returned."""
    rows: list[dict[str, Any]] = []
    try:
        for line in paths.metrics.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                if isinstance(row, dict):
                    rows.append(row)
    except (OSError, ValueError):
        rows = []
    last = next((r for r in reversed(rows) if r.get("final")), rows[-1] if rows else {})
    step = last.get("step") if isinstance(last.get("step"), int) else None
    throughput = next((r[THROUGHPUT] for r in reversed(rows) if isinstance(r.get(THROUGHPUT), (int, float))), None)
    final = _numbers(last)
    final.update(_numbers(RankOutcome(paths, 0).result))
    return RunMetrics(step, final, throughput)
