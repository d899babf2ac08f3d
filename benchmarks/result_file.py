"""A benchmark's results file, benchmarks/results/<name>.json: the date, the machine it ran on, and its figures."""

from __future__ import annotations

import json
import os
import platform
from datetime import date
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def write(name: str, **figures: object) -> Path:
    import torch

    machine = {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
               "torch": torch.__version__}
    out = RESULTS / f"{name}.json"
    out.write_text(json.dumps({"date": str(date.today()), "machine": machine, **figures}, indent=1) + "\n")
    return out
