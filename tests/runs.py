"""Running the real `run` command in a test, and checking what it leaves behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil

RUN = str(Path(sys.executable).parent / "run")
TESTS = Path(__file__).parent


@dataclass
class Finished:
    code: int
    stdout: str
    stderr: str
    run_id: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run(*overrides: str, cwd: Path, timeout: float = 180, run_id: str | None = None,
        env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()) -> Finished:
    """`run` with these overrides in ``cwd``; the tests' workloads are importable; a unique run id.
    ``env``: the environment (default: this one); ``prefix``: a command that starts `run` (salloc ...)."""
    run_id = run_id or f"t{uuid.uuid4().hex[:10]}"
    base = os.environ if env is None else env
    env = {**base, "PYTHONPATH": os.pathsep.join([str(TESTS), base.get("PYTHONPATH", "")])}
    args = [*prefix, RUN, *overrides]
    if not any(o.startswith("run_id=") for o in overrides):
        args.append(f"run_id={run_id}")
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return Finished(proc.returncode, proc.stdout, proc.stderr, run_id)


def signal_when_ready(args: list[str], cwd: Path, sig: int, ready: str, count: int = 1, timeout: float = 60,
                      env: dict[str, str] | None = None) -> Finished:
    """Start `run` with ``args`` (one of them ``run_id=...``); once ``count`` files under ``cwd`` match the
    glob ``ready``, send it ``sig``, and wait for it to end."""
    run_id = next(a.split("=", 1)[1] for a in args if a.startswith("run_id="))
    proc = subprocess.Popen([RUN, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + timeout
        while len(list(cwd.glob(ready))) < count:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return Finished(proc.returncode, out, err, run_id)


def processes_of(run_id: str) -> list[psutil.Process]:
    """Live processes of a run: ranks carry TORCHELASTIC_RUN_ID; `run` and its launch agent carry
    `run_id=<id>` on their command line (the tests always pass one)."""
    found = []
    for p in psutil.process_iter():
        try:
            mine = p.environ().get("TORCHELASTIC_RUN_ID") == run_id or f"run_id={run_id}" in p.cmdline()
            if mine and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def artifacts(folder: Path) -> dict[int, dict]:
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in folder.glob("rank*.json")}


def run_folder(cwd: Path) -> Path:
    """The single run folder a `run` made under cwd/outputs."""
    (folder,) = [p.parent for p in (cwd / "outputs").glob("*/*/spec.yaml")]
    return folder
