"""runner.worker.store_server: host 0's store served from a process of its own, a child of the zygote, so that no
process that forks has a thread of torch's (a thread inside a name lookup at a fork left the child's resolver locked
for good)."""

from __future__ import annotations

import datetime
import os
import signal
import socket
import subprocess
import sys
import textwrap

import psutil
import pytest

from runs import wait_until
from runner.worker.store_server import StoreServerError, serve_from_zygote


def _tasks() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def _bound() -> tuple[int, int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    port = sock.getsockname()[1]
    return sock.detach(), port


def _client(port: int):
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=10), wait_for_workers=False)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_the_store_serves_from_a_child_of_the_zygote_and_the_caller_gains_no_thread(zygote) -> None:
    before = _tasks()
    fd, port = _bound()
    server = serve_from_zygote(zygote, "127.0.0.1", fd, port, 10)
    try:
        assert not _tasks() - before  # no new thread here: the store's is in the other process
        assert os.getsid(server.pid) == server.pid  # its own session
        assert psutil.Process(server.pid).ppid() == zygote.process.pid
        assert len(os.listdir(f"/proc/{zygote.process.pid}/task")) == 1  # the zygote forks with one thread still
        with pytest.raises(OSError):
            os.fstat(fd)  # the socket is the store process's alone
        client = _client(server.port)
        client.set("k", b"v")
        assert _client(server.port).get("k") == b"v"
    finally:
        pid = server.pid
        server.stop()
    assert _gone(pid)  # killed and reaped
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_signals_that_stop_a_job_leave_the_store_serving_until_it_is_stopped(zygote) -> None:
    fd, port = _bound()
    server = serve_from_zygote(zygote, "127.0.0.1", fd, port, 10)
    try:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
            os.kill(server.pid, signum)
        client = _client(server.port)
        client.set("still", b"here")
        assert client.get("still") == b"here"
    finally:
        server.stop()


def test_a_socket_torch_cannot_serve_on_is_refused_with_torchs_reason(zygote) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # bound, never listening: the store cannot accept
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    r, w = os.pipe()
    os.close(w)
    with pytest.raises(StoreServerError):
        serve_from_zygote(zygote, "127.0.0.1", r, port, 2)  # a pipe is no socket
    sock.close()


def test_the_store_dies_with_the_agent_that_served_it(tmp_path) -> None:
    """An agent killed outright leaves no store behind (PR_SET_PDEATHSIG: its zygote dies with it, and the store with
    the zygote)."""
    pid_file = tmp_path / "store.pid"
    code = textwrap.dedent(f"""
        import os, socket, sys
        from runner.worker.store_server import serve_from_zygote
        from runner.worker.zygote import Zygote
        sock = socket.socket(); sock.bind(("127.0.0.1", 0)); sock.listen(4)
        port = sock.getsockname()[1]
        server = serve_from_zygote(Zygote.start(), "127.0.0.1", sock.detach(), port, 10)
        open({str(pid_file)!r}, "w").write(str(server.pid))
        os.kill(os.getpid(), 9)
    """)
    done = subprocess.run([sys.executable, "-c", code], timeout=120)
    assert done.returncode == -signal.SIGKILL
    store_pid = int(pid_file.read_text())
    wait_until(lambda: _gone(store_pid), 30, f"the store process {store_pid} to end with its agent")
