"""The bed's processes: daemons started detached and recorded by pid and start time (so that `down` stops those
and no other process that reuses a pid), waiting for them to come up, and every process inside the bed's namespaces."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bed.common import TestbedError, sh
from bed.layout import Host, Paths, Plan

GRACE = 5.0  # seconds between SIGTERM and SIGKILL


def wait_for(what: str, ready: Callable[[], bool], timeout: float, detail: Callable[[], str] = lambda: "",
             daemons: Paths | None = None) -> None:
    """Poll ``ready()`` every 0.1 s until it is true; after ``timeout`` seconds raise with ``detail()``.
    With ``daemons``, raise at once when a daemon recorded there has exited.

    Only for daemons coming up, which tell nobody when they are ready.
    """
    deadline = time.monotonic() + timeout
    while not ready():
        dead = dead_daemons(daemons) if daemons else []
        if dead:
            raise TestbedError(f"{what}: {', '.join(dead)} exited\n{detail()}")
        if time.monotonic() > deadline:
            raise TestbedError(f"{what}: not after {timeout:.0f} s\n{detail()}")
        time.sleep(0.1)


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (field 22 of /proc/PID/stat), None if it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def alive(pid: int, started: str | None = None) -> bool:
    """Running (not a zombie) and, if ``started`` is given, the same process as recorded (no PID reuse)."""
    now = start_time(pid)
    return now is not None and (started is None or now == started)


def spawn(paths: Paths, daemon: str, argv: Sequence[str]) -> int:
    """Start a foreground daemon detached (own session, output to logs/DAEMON.out); record "PID STARTTIME"."""
    with open(paths.logs / f"{daemon}.out", "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=paths.root)
    paths.pid_file(daemon).write_text(f"{proc.pid} {start_time(proc.pid)}\n")
    return proc.pid


def recorded(paths: Paths) -> dict[str, tuple[int, str]]:
    """Daemon name -> (pid, start time) from the pid files."""
    found = {}
    for f in sorted(paths.pids.glob("*.pid")) if paths.pids.is_dir() else []:
        with contextlib.suppress(ValueError):
            pid, started = f.read_text().split()
            found[f.stem] = (int(pid), started)
    return found


def dead_daemons(paths: Paths) -> list[str]:
    """The recorded daemons that are no longer running."""
    return [name for name, (pid, started) in recorded(paths).items() if not alive(pid, started)]


def terminate(pids: dict[int, str | None], grace: float = GRACE) -> None:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL what is left. ``pids``: pid -> start time or None."""
    def signal_all(sig: int) -> None:
        for pid, started in pids.items():
            if alive(pid, started):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)

    signal_all(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(alive(p, s) for p, s in pids.items()) and time.monotonic() < deadline:
        time.sleep(0.05)
    signal_all(signal.SIGKILL)
    deadline = time.monotonic() + 2
    while any(alive(p, s) for p, s in pids.items()) and time.monotonic() < deadline:
        time.sleep(0.05)


def record_netns(paths: Paths, host: Host) -> None:
    """Remember the namespace's inode: its processes can be found even once its name is gone."""
    paths.netns_inode(host.name).write_text(f"{os.stat(host.netns_path).st_ino}\n")


def namespace_pids(plan: Plan, paths: Paths) -> dict[int, None]:
    """Every process inside one of the bed's namespaces (slurmd, slurmstepd, tasks, orted...), not ourselves:
    ``ip netns pids`` for the namespaces that have their names, and a look through /proc for the recorded
    inodes of those that lost them (``ip netns del`` while a process still held the namespace)."""
    me = {os.getpid(), os.getppid()}
    pids: set[int] = set()
    for h in plan.hosts:
        if Path(h.netns_path).exists():
            pids.update(int(p) for p in sh("ip", "netns", "pids", h.name, check=False).stdout.split() if p.isdigit())
    inodes = set()
    for h in plan.hosts:
        with contextlib.suppress(OSError, ValueError):
            inodes.add(f"net:[{int(paths.netns_inode(h.name).read_text())}]")
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and os.readlink(proc / "ns" / "net") in inodes:
                pids.add(int(proc.name))
    return {pid: None for pid in pids - me}
