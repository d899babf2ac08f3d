"""The main process's metrics file (metrics.jsonl): what ``ctx.log`` writes, one JSON line a step."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from runner.common.formatting import number


class MetricsLog:
    """Rows of ``{"step", "time_s", **metrics}`` appended to ``path``, ``time_s`` counted from when the log was made
    (with the run context). The file is opened on the first row, line-buffered, so that a row is in it once written
    (a report reads it while the run goes on, and after a crash); :meth:`close` closes it."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._file: TextIO | None = None
        self._t0 = time.perf_counter()

    def write(self, step: int, metrics: Mapping[str, float], echo: bool) -> None:
        """One row; with ``echo``, also a line ``step N: key=value ...`` on stdout (the rank's log)."""
        row = {"step": step, "time_s": round(time.perf_counter() - self._t0, 4), **metrics}
        if self._file is None:
            self._file = open(self._path, "a", buffering=1)
        self._file.write(json.dumps(row) + "\n")
        if echo:
            shown = " ".join(f"{k}={number(v)}" for k, v in metrics.items())
            print(f"step {step}: {shown}", flush=True)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
