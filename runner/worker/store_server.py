"""Host 0's rendezvous store, served from a process of its own so that the host agent stays single-threaded.

The agent forks its ranks (runner.worker.rank_process). A fork copies only the thread that calls it: a lock that
another thread held at that moment stays held in the child forever. torch's TCPStore server runs a thread that
looks up every connecting peer's name (glibc's resolver, under its own lock); a rank forked while that thread was
inside a lookup hung in its first connection to the store, before its first line (seen in full runs: a 3-rank job
that never started). Served here, the store's thread lives in a process that forks nothing, and the agent has no
thread of torch's at any fork.

The store process: forked before any rank, its own session (a terminal's Ctrl-C is the agent's to pass on), deaf to
the signals that stop a job (the ranks may still use the store while they end), killed when the agent closes the
rendezvous or dies (``PR_SET_PDEATHSIG``). It keeps the descriptors it inherited: closing descriptors it does not
own is unsafe in a process that goes on running library code (the C library's name lookups may hold some), and it
never outlives the agent that holds them anyway.
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
from dataclasses import dataclass

from runner.common.signals import kill_child
from runner.worker.rank_process import die_with_parent

READY = b"ok"
_IGNORED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


class StoreServerError(Exception):
    """The store process could not serve (its reason, as torch said it)."""


@dataclass
class StoreServer:
    """The agent's handle on the process that serves the store."""

    pid: int
    port: int

    def stop(self) -> None:
        """Kill the store's process and reap it; every client's next call fails."""
        if self.pid:
            kill_child(self.pid)
            self.pid = 0


def serve_from_child(addr: str, listen_fd: int, port: int, timeout_s: float) -> StoreServer:
    """Serve a TCPStore on ``listen_fd`` (bound and listening) from a new process, which owns the socket from
    here: the caller's descriptor is closed. Returns once the store accepts connections; raises
    StoreServerError with torch's reason when it cannot be made."""
    ready_r, ready_w = os.pipe()
    agent = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        _serve(addr, listen_fd, port, timeout_s, ready_w, agent)  # never returns
    os.close(ready_w)
    os.close(listen_fd)
    try:
        said = _read_all(ready_r)
    finally:
        os.close(ready_r)
    server = StoreServer(pid, port)
    if said != READY:
        server.stop()
        raise StoreServerError(said.decode(errors="replace") or "the store's process ended before it served")
    return server


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    return b"".join(chunks)


def _serve(addr: str, listen_fd: int, port: int, timeout_s: float, ready_w: int, agent: int) -> None:
    try:
        os.setsid()
        die_with_parent()
        if os.getppid() != agent:  # the agent died before we asked to die with it
            os._exit(1)
        for signum in _IGNORED:
            signal.signal(signum, signal.SIG_IGN)
        import torch.distributed as dist

        store = dist.TCPStore(addr, port, None, True, datetime.timedelta(seconds=timeout_s),
                              wait_for_workers=False, master_listen_fd=listen_fd)
    except BaseException as e:  # noqa: BLE001 - its reason goes to the agent, which says it
        os.write(ready_w, (str(e) or type(e).__name__).encode())
        os._exit(1)
    os.write(ready_w, READY)
    os.close(ready_w)
    while store is not None:  # until the agent kills this process, or dies
        signal.pause()
    os._exit(0)
