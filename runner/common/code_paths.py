"""Where the runner's own code is, for the places that tell a frame of the user's code from one of the runner's: a
script's traceback cut to the script's frames (runner.worker.script), the user's frame a rank's watch names
(runner.worker.watch), a stack dump's frames of the rank's body left out (runner.worker.failures)."""

from __future__ import annotations

import os
from pathlib import Path

RUNNER_DIR = Path(__file__).resolve().parents[1]  # the runner package: every frame of the runner's
WORKER_DIR = RUNNER_DIR / "worker"  # a rank's body (runner.worker.rank, script, watch): around the user's code


def in_runner(filename: str) -> bool:
    """``filename`` (a frame's, as Python names it) is a module of the runner's."""
    return filename.startswith(f"{RUNNER_DIR}{os.sep}")


def faulthandler_frame_of_worker(line: str) -> bool:
    """A line of a faulthandler stack dump (``  File "/path/x.py", line N in f``) is a frame of a rank's body."""
    return f'"{WORKER_DIR}{os.sep}' in line
