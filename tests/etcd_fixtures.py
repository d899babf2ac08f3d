"""A real etcd for a test (Debian's etcd-server, which scripts/system_packages.sh installs): :func:`local_etcd` starts a
one-member cluster on an address of this machine, on two free ports, and stops it (by its pid) and removes its data
at the end. The decisions of a job that outlives its hosts are made in etcd (runner.launchers.elastic)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from runner.launchers.elastic.etcd import Etcd, EtcdError
from runner.launchers.elastic.etcd_member import ETCD
from runs import wait_until


def free_ports(addr: str, count: int) -> list[int]:
    """``count`` ports free on ``addr`` now (the kernel's choice: a test hard-codes none)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind((addr, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def serving(endpoint: str) -> bool:
    try:
        Etcd([endpoint], ask_s=1.0).get("/ready")
        return True
    except EtcdError:
        return False


@contextmanager
def local_etcd(addr: str = "127.0.0.1") -> Iterator[str]:
    """A one-member etcd on ``addr``; its client endpoint (``addr:port``)."""
    folder = Path(tempfile.mkdtemp(prefix="test-etcd-"))
    client, peer = free_ports(addr, 2)
    argv = [ETCD, "--name", "test", "--data-dir", str(folder / "data"), "--logger", "zap",
            "--listen-client-urls", f"http://{addr}:{client}", "--advertise-client-urls", f"http://{addr}:{client}",
            "--listen-peer-urls", f"http://{addr}:{peer}", "--initial-advertise-peer-urls", f"http://{addr}:{peer}",
            "--initial-cluster", f"test=http://{addr}:{peer}"]
    with open(folder / "etcd.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: serving(f"{addr}:{client}"), 30, "the test's etcd serving", alive=[proc])
        yield f"{addr}:{client}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)
