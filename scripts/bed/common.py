"""What every part of the test bed uses: its error, progress messages, running a command, the machine-wide lock."""

from __future__ import annotations

import contextlib
import fcntl
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

# One lock for every bed on the machine: held while a subnet is chosen and claimed, and while /etc/hosts is edited.
LOCK_FILE = Path("/run/lock/testbed.lock")
VERBOSE = True  # progress on stderr; `testbed.py -q` turns it off


class TestbedError(Exception):
    """A failure whose message is meant for the person running the script."""


def say(msg: str) -> None:
    """Progress on stderr (stdout carries only the JSON description)."""
    if VERBOSE:
        print(f"testbed: {msg}", file=sys.stderr, flush=True)


def sh(*argv: str, check: bool = True, timeout: float = 30,
       env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command, capture its output; with ``check`` a failure raises TestbedError showing the command."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise TestbedError(f"timed out after {timeout:.0f} s: {shlex.join(argv)}") from e
    except FileNotFoundError as e:
        raise TestbedError(f"{argv[0]} is not installed (run scripts/system_packages.sh)") from e
    if check and done.returncode != 0:
        why = (done.stderr or done.stdout).strip()
        raise TestbedError(f"`{shlex.join(argv)}` failed (exit {done.returncode}): {why}")
    return done


@contextlib.contextmanager
def machine_lock() -> Iterator[None]:
    """Exclusive lock shared by all beds on this machine (subnet choice, /etc/hosts edits)."""
    LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK_FILE, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def tail(path: Path, lines: int = 25) -> str:
    """The last lines of a log file, headed by its path (for error messages)."""
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return f"--- {path}: (none)"
    return f"--- {path}:\n" + "\n".join(text)
