"""The agent's client of host 0's store itself: a child of the host's zygote (runner.worker.zygote forks it and calls
:func:`serve`) that holds the TCPStore client and answers the agent's calls (runner.worker.channel_proxy, the agent's
end, says why it lives apart)."""

from __future__ import annotations

import os
import signal
import socket

from runner.worker.channel import ChannelError, JobChannel
from runner.worker.rank_process import die_with_parent
from runner.worker.said_once import say_each_once
from runner.worker.zygote_wire import receive, send

_DEAF_TO = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def serve(fd: int, addr: str, port: int, timeout_s: float, parent: int) -> None:
    """The child's life (forked by the zygote, ``parent``): connect, say so, answer until the agent closes the socket.
    Never returns."""
    die_with_parent()
    if os.getppid() != parent:
        os._exit(1)
    for signum in _DEAF_TO:  # a job's stop is its agent's to pass on: the channel must stay to carry it
        signal.signal(signum, signal.SIG_IGN)
    say_each_once()  # c10d's warnings at every retry while host 0's store is not up yet, once each
    sock = socket.socket(fileno=fd)
    try:
        kv = JobChannel.reach(addr, port, timeout_s).key_value
    except ChannelError as e:
        send(sock, ("error", str(e)))
        os._exit(1)
    send(sock, ("ok", None))
    while True:
        try:
            op, args = receive(sock)[0]
        except (EOFError, OSError):
            os._exit(0)
        try:
            answer: tuple[str, object] = ("ok", getattr(kv, op)(*args))
        except (RuntimeError, OSError, ValueError) as e:  # what a TCPStore raises when its store is gone
            answer = ("raised", str(e) or type(e).__name__)
        try:
            send(sock, answer)
        except OSError:
            os._exit(0)
