"""Host 0's rendezvous store, served from a process of its own, a child of the host's zygote (runner.worker.zygote).

The store's thread (torch's TCPStore server looks up every connecting peer's name, under glibc's resolver lock) must
live in a process that forks nothing: a rank forked while such a thread was inside a lookup hung in its first
connection to the store (seen in full runs, when the agent that forked the ranks served the store itself). Forked
from the zygote, it has torch imported already, and neither the agent nor the zygote has a thread of torch's.

The store process: its own session (a terminal's Ctrl-C is the agent's to pass on), deaf to the signals that stop a
job (the ranks may still use the store while they end), killed when the agent closes the rendezvous, or with the
zygote (``PR_SET_PDEATHSIG``), which dies with the agent. It keeps the descriptors it inherited but the zygote's own:
closing descriptors it does not own is unsafe in a process that goes on running library code (the C library's name
lookups may hold some), and it never outlives the agent that holds them anyway.
"""

from __future__ import annotations

import os
import selectors
import signal
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from runner.worker.store_process import READY

if TYPE_CHECKING:
    from runner.worker.zygote import Zygote

READY_WAIT_S = 60.0  # how long the agent waits for the store's process to serve (torch makes it in well under 1 s)
STOP_WAIT_S = 10.0  # how long stop() waits for the zygote to have reaped the store's process


class StoreServerError(Exception):
    """The store process could not serve (its reason, as torch said it)."""


@dataclass
class StoreServer:
    """The agent's handle on the process that serves the store."""

    pid: int
    port: int
    pidfd: int = -1
    zygote: Zygote | None = field(default=None, repr=False)

    def stop(self) -> None:
        """Kill the store's process and wait until the zygote has reaped it; every client's next call fails."""
        if self.pid:
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if self.zygote is not None:
                self.zygote.exit_code(self.pid, STOP_WAIT_S)
            os.close(self.pidfd)
            self.pid = 0


def serve_from_zygote(zygote: Zygote, addr: str, listen_fd: int, port: int, timeout_s: float) -> StoreServer:
    """Serve a TCPStore on ``listen_fd`` (bound and listening) from a new child of ``zygote``, which owns the socket
    from here: the caller's descriptor is closed. Returns once the store accepts connections; raises
    StoreServerError with torch's reason when it cannot be made (runner.worker.zygote.ZygoteGone: no zygote)."""
    ready_r, ready_w = os.pipe()
    try:
        try:
            pid, pidfd = zygote.serve_store(addr, port, timeout_s, listen_fd, ready_w)
        finally:
            os.close(ready_w)
            os.close(listen_fd)
        said = _read_all(ready_r, READY_WAIT_S)
    finally:
        os.close(ready_r)
    server = StoreServer(pid, port, pidfd, zygote)
    if said != READY:
        server.stop()
        raise StoreServerError(said.decode(errors="replace") or "the store's process ended before it served")
    return server


def _read_all(fd: int, timeout_s: float) -> bytes:
    """What the store's process says until it closes the pipe; what it said by then if that takes over ``timeout_s``
    (no path of `run` waits without an end)."""
    chunks = []
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if not selector.select(left):
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    return b"".join(chunks) or f"it did not serve within {timeout_s:g} s".encode()
