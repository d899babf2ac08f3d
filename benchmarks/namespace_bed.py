"""A bed of namespace hosts for the benchmarks that need several hosts (scripts/testbed.py ``up``, then ``down`` by
:meth:`Bed.close`), as the tests' fixture makes one (tests/testbed_fixtures.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TESTBED = Path(__file__).resolve().parent.parent / "scripts" / "testbed.py"


class Bed:
    """``hosts`` namespace hosts named ``prefix...``, with an sshd each where ``sshd``."""

    def __init__(self, state: Path, *, hosts: int, prefix: str, sshd: bool = False) -> None:
        self.state = state
        up = self._cmd("up", "--hosts", str(hosts), "--prefix", prefix, *(("--sshd",) if sshd else ()))
        done = subprocess.run(up, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise SystemExit(f"testbed.py up failed (exit {done.returncode}):\n{done.stderr}")
        self.description = json.loads(done.stdout)
        self.hosts = self.description["hosts"]
        self.ssh = self.description.get("ssh")

    def _cmd(self, *args: str) -> list[str]:
        return [sys.executable, str(TESTBED), "-q", args[0], "--state", str(self.state), *args[1:]]

    def exec_argv(self, i: int, argv: list[str]) -> list[str]:
        """``argv`` run inside host ``i``'s network namespace (as tests/testbed_fixtures.py's ``Bed.exec_argv``)."""
        return ["nsenter", f"--net={self.hosts[i]['netns_path']}", "--", *argv]

    def free_port(self, i: int) -> int:
        """A port free in host ``i``'s namespace (port 0 there)."""
        code = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"
        return int(subprocess.run(self.exec_argv(i, [sys.executable, "-c", code]), capture_output=True, text=True,
                                  check=True, timeout=30).stdout)

    def link(self, i: int, up: bool) -> None:
        """Host ``i``'s link up or down (down: its packets are dropped, no connection is closed)."""
        h = self.hosts[i]
        subprocess.run(self.exec_argv(i, ["ip", "link", "set", h["ifname"], "up" if up else "down"]), check=True)

    def pids(self, i: int | None = None) -> list[int]:
        """Processes in host ``i``'s namespace (every host's: None), but the bed's sshd daemons."""
        hosts = self.hosts if i is None else [self.hosts[i]]
        nets = {f"net:[{os.stat(h['netns_path']).st_ino}]" for h in hosts}
        daemons = {int(h["sshd_pid"]) for h in self.ssh["hosts"].values()} if self.ssh else set()
        found = []
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and int(proc.name) not in daemons and os.readlink(proc / "ns" / "net") in nets:
                    found.append(int(proc.name))
            except OSError:
                continue
        return found

    def close(self) -> None:
        """Every link up again (a trial may have taken one down), then the bed down."""
        for i in range(len(self.hosts)):
            self.link(i, up=True)
        done = subprocess.run(self._cmd("down"), capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            print(f"testbed.py down failed (exit {done.returncode}):\n{done.stderr}", file=sys.stderr)
