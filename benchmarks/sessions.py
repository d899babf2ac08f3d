"""One command in a session of its own, ended with everything it started where it runs past its time: what the
benchmarks time and the GPU checks run (a hung command must not hang the benchmark)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Ended:
    """How a command ended: its exit status (None: killed past ``timeout_s``), its output (stdout and stderr
    together), the seconds it took, and its pid (its session's id)."""

    code: int | None
    output: str
    seconds: float
    pid: int


def in_session(argv: list[str], cwd: Path, timeout_s: float, env: Mapping[str, str] | None = None) -> Ended:
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return Ended(None, out, time.perf_counter() - t0, proc.pid)
    return Ended(proc.returncode, out, time.perf_counter() - t0, proc.pid)
