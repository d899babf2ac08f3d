"""Where a host's processes meet the others: the store that host 0 serves (env:// and tcp://; from a process of
its own, runner.worker.store_server), or the run's fresh init file (file://), made ready before any of the host's
processes starts."""

from __future__ import annotations

import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from runner.common.errors import HintedError
from runner.plan.processes import Deferred, Plan
from runner.records.paths import RunPaths
from runner.spec.schema import InitMethod
from runner.spec.topology import is_loopback
from runner.worker.store_server import StoreServer, StoreServerError, serve_from_zygote

if TYPE_CHECKING:
    from runner.worker.zygote import Zygote


@dataclass
class Rendezvous:
    """The concrete meeting point of one run, and what this host holds open for it."""

    init_method: str
    master_port: str  # the port the processes get (MASTER_PORT; with file:// init, the plan's, unused)
    agent_store: bool  # this host's agent serves the store (TORCHELASTIC_USE_AGENT_STORE)
    server: StoreServer | None = None  # the process that serves this host's store (and holds its socket)
    file: Path | None = None  # the init file, removed afterwards
    notes: list[str] = field(default_factory=list)

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self.file is not None:
            self.file.unlink(missing_ok=True)
            try:
                self.file.parent.rmdir()  # the run's private folder, once no attempt's file is left
            except OSError:
                pass


class RendezvousError(HintedError):
    """The meeting point cannot be made; ``hint`` says what to do (runner.common.errors)."""


def _serve_store(zygote: Zygote, addr: str, port: int, single_host: bool, timeout_s: float,
                 may_move: bool = True) -> StoreServer:
    """Serve the rendezvous TCPStore (from a child of ``zygote``: runner.worker.store_server) on a socket we bind
    ourselves: loopback only for one host whose master is loopback, and the port is ours from the moment it is
    chosen (no free-port race). ``may_move``: nobody else was told the port (one host, one agent), so a taken one
    may give way to a free one."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    bind = "127.0.0.1" if single_host and is_loopback(addr) else "0.0.0.0"
    try:
        sock.bind((bind, port))
    except OSError as e:
        if not (single_host and may_move):  # the other hosts (or tasks) were told this port
            sock.close()
            raise RendezvousError(f"cannot listen on {bind}:{port} for the rendezvous store: {e.strerror}",
                                  "another job holds the port; leave init.master_port=0, or pick another") from None
        sock.bind((bind, 0))  # one host: nobody else needs to know the port, take a free one
        print(f"warning: init.master_port={port} is in use on this machine ({e.strerror}); using the free port "
              f"{sock.getsockname()[1]} instead", file=sys.stderr)
    sock.listen(1024)
    port = sock.getsockname()[1]
    try:  # the store's process owns the listening socket from here (serve_from_zygote closes ours)
        return serve_from_zygote(zygote, addr, sock.detach(), port, timeout_s)
    except StoreServerError as e:
        raise RendezvousError(f"cannot serve the rendezvous store on {bind}:{port}: {e}") from None


def stale_rendezvous_file(path: Path) -> None:
    """An init file from an earlier run is never reused: refuse it."""
    if path.exists():
        raise RendezvousError(f"init file {path} already exists (a stale file from an earlier run?); it is "
                              f"never reused", "remove it or start a new run")


def prepare_rendezvous(plan: Plan, node_rank: int, paths: RunPaths, zygote: Zygote, serve: bool | None = None,
                       only: bool = False) -> Rendezvous:
    """This agent's part of the run's rendezvous: on host 0 (``serve``; default: node 0) the store, served for every
    rank (env://, tcp://) from a child of the host's ``zygote``, or the init file's private folder (file://).
    ``only``: the agent of one rank (a task per process), beside other tasks of its host whose ranks may have made the
    init file already."""
    spec = plan.job.spec
    single = len(plan.job.hosts) == 1
    serve = node_rank == 0 if serve is None else serve
    if spec.init.method is InitMethod.file:
        path = paths.rendezvous_file(spec.init.dir)
        # With several hosts (or tasks), another's ranks may have made the file already: the launch checked
        # before any of them started (runner.app.launch)
        if single and not only:
            stale_rendezvous_file(path)
        RunPaths.make_private(path.parent)
        return Rendezvous(f"file://{path}", str(plan.master_port), False, file=path if serve else None)
    addr = plan.master_addr
    port = int(plan.master_port) if not isinstance(plan.master_port, Deferred) else 0
    server = None
    if serve:
        server = _serve_store(zygote, addr, port, single, spec.init.timeout_s, may_move=not only)
        port = server.port
    return Rendezvous(plan.init_url(port), str(port), True, server=server)
