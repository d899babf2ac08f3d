"""The job's channel (runner.worker.channel) for a host agent, which imports no torch: a child of the host's zygote
(runner.worker.zygote), which has torch imported already, holds the TCPStore client and does the agent's
``set``/``get``/``first`` on host 0's store, asked over a Unix socket.

Importing torch costs a process over a second of CPU; the agent of a job across hosts needs host 0's store for the
channel alone (its ranks are forked by the zygote, its store served by another child of it), so it borrows the
zygote's torch instead of importing its own. The child dies with the zygote, which dies with the agent; the agent
closes it with the attempt.
"""

from __future__ import annotations

import os
import select
import signal
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

from runner.worker.zygote_wire import receive, send

if TYPE_CHECKING:
    from runner.worker.zygote import Zygote

LOOK_S = 0.2  # while it waits for the store: how often the agent is asked whether to give up
ANSWER_S = 10.0  # a store that has not answered a question within this is taken as gone (its host's link is down:
# a TCPStore client waits for its whole timeout, minutes, where the agent must go on watching its ranks)


class ProxyError(RuntimeError):
    """The store did not answer (gone, or the connection to it broke): what a TCPStore raises, as the channel reads it."""


class ProxyKeyValue:
    """A runner.worker.channel.KeyValue whose store is reached by a child of the zygote."""

    def __init__(self, sock: socket.socket, pid: int, pidfd: int, zygote: Zygote) -> None:
        self._sock, self._pid, self._pidfd, self._zygote = sock, pid, pidfd, zygote

    @classmethod
    def reach(cls, zygote: Zygote, addr: str, port: int, timeout_s: float,
              interrupted: Callable[[], bool] | None = None) -> ProxyKeyValue:
        """A client of the store at ``addr:port`` in a new child of ``zygote``, once it has connected (within
        ``timeout_s``). ``interrupted``: asked every :data:`LOOK_S` while it waits; true: the wait is given up
        (runner.worker.channel.ChannelInterrupted). Raises runner.worker.channel.ChannelError (or ZygoteGone)."""
        from runner.worker.channel import ChannelError, ChannelInterrupted

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            pid, pidfd = zygote.serve_channel(addr, port, timeout_s, theirs.fileno())
        finally:
            theirs.close()
        proxy = cls(ours, pid, pidfd, zygote)
        while not select.select([ours], [], [], LOOK_S)[0]:
            if interrupted is not None and interrupted():
                proxy.close()
                raise ChannelInterrupted(f"stopped while waiting for host 0's store at {addr}:{port}")
        try:
            (said, why), _ = receive(ours)
        except (EOFError, OSError):
            said, why = "error", "the store's client ended before it connected"
        if said != "ok":
            proxy.close()
            raise ChannelError(str(why))
        return proxy

    def set(self, key: str, value: bytes) -> None:
        self._call("set", key, value)

    def get(self, key: str) -> bytes | None:
        return self._call("get", key)

    def first(self, key: str, value: bytes) -> bool:
        return self._call("first", key, value)

    def close(self) -> None:
        """End the child (and wait until the zygote has reaped it)."""
        if self._pid:
            self._sock.close()
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._zygote.exit_code(self._pid, 10.0)
            os.close(self._pidfd)
            self._pid = 0

    def _call(self, op: str, *args: object) -> object:

        if not self._pid:
            raise ProxyError("the channel is closed")
        try:
            send(self._sock, (op, args))
            if not select.select([self._sock], [], [], ANSWER_S)[0]:
                self.close()
                raise ProxyError(f"the store did not answer within {ANSWER_S:g} s")
            (said, value), _ = receive(self._sock)
        except (EOFError, OSError) as e:
            raise ProxyError(f"the store's client ended ({e or 'closed'})") from e
        if said == "raised":
            raise ProxyError(str(value))
        return value
