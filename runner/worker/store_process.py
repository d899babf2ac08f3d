"""The store's process itself: a child of the host's zygote (runner.worker.zygote forks it and calls :func:`serve`)
that serves host 0's rendezvous TCPStore until it is killed. The agent's handle on it is runner.worker.store_server,
which says why it lives apart."""

from __future__ import annotations

import datetime
import os
import signal

from runner.worker.rank_process import die_with_parent
from runner.worker.said_once import say_each_once

READY = b"ok"
LOOPBACK = "127.0.0.1"
_IGNORED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def serve(addr: str, listen_fd: int, port: int, timeout_s: float, ready_w: int, parent: int) -> None:
    """The store's process (forked by the zygote, ``parent``): serve until killed. Never returns."""
    try:
        os.setsid()
        die_with_parent()
        if os.getppid() != parent:  # the zygote died before we asked to die with it
            os._exit(1)
        for signum in _IGNORED:
            signal.signal(signum, signal.SIG_IGN)
        say_each_once()  # c10d's warnings about each peer, once each
        import torch.distributed as dist

        # its own client dials loopback, where the socket listens whichever address the job gives host 0 (that
        # address is for the other hosts: a name this host cannot resolve must not keep the store from serving)
        store = dist.TCPStore(LOOPBACK, port, None, True, datetime.timedelta(seconds=timeout_s),
                              wait_for_workers=False, master_listen_fd=listen_fd)
    except BaseException as e:  # noqa: BLE001 - its reason goes to the agent, which says it
        os.write(ready_w, f"{str(e) or type(e).__name__} (the store of {addr}:{port})".encode())
        os._exit(1)
    os.write(ready_w, READY)
    os.close(ready_w)
    while store is not None:  # until the agent kills this process, or dies
        signal.pause()
    os._exit(0)
