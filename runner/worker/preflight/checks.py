"""The preflight checks, one by one, and a host's line of them (runner.worker.preflight)."""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from runner.common.polling import retry
from runner.spec.schema import DeviceKind
from runner.spec.topology import Host
from runner.worker.network import NetworkError, interface_of, resolve, route_source

if TYPE_CHECKING:
    from runner.worker.network import InterfaceChoice

COLLECTIVE_TIMEOUT_S = 30.0  # rendezvous + all-reduce at most (init.timeout_s when that is shorter)
DEADLINE_GRACE_S = 5.0  # after that timeout, the collective is given up on (not every wait honours it)
CONNECT_ATTEMPT_S = 3.0  # one TCP connection attempt to master:port
REFUSED_AGAIN_S = 0.25  # a refused connection (host 0 not listening yet) is tried again this often
CONNECT_WINDOW_S = 30.0  # how long a refused port is tried again: host 0 may start later (a busy node, srun's skew)
MANUAL_CONNECT_WINDOW_S = 30.0  # launcher=manual: hosts are started by hand, one after the other


@dataclass(frozen=True)
class Check:
    """One finding on a host: what was found (``text``), or why it fails (``failure``) and what to do."""

    text: str
    failure: str | None = None
    hint: str = ""

    @classmethod
    def failed(cls, failure: str, hint: str = "") -> Check:
        return cls("", failure, hint)

    @property
    def ok(self) -> bool:
        return self.failure is None

    def render(self) -> str:
        return self.text if self.ok else f"FAILED: {self.failure}" + (f" — hint: {self.hint}" if self.hint else "")


@dataclass(frozen=True)
class HostChecks:
    """A host's line: who it is, then its checks in order (a failed one is the last)."""

    header: str  # "preflight node1 (tb1234h2, 10.0.0.12)"
    checks: tuple[Check, ...] = ()

    @property
    def failed(self) -> bool:
        return any(not c.ok for c in self.checks)

    def add(self, check: Check) -> HostChecks:
        return replace(self, checks=(*self.checks, check))

    def line(self) -> str:
        return f"{self.header}: " + " · ".join(c.render() for c in self.checks)


class PreflightFailed(Exception):
    """A process's preflight failed; the message is its line."""


def collective_timeout_s(init_timeout_s: float) -> float:
    return min(init_timeout_s, COLLECTIVE_TIMEOUT_S)


def is_loopback_ip(ip: str) -> bool:
    return ipaddress.ip_address(ip).is_loopback




def check_master(addr: str, hosts: int, one_machine: bool, master_host: bool) -> tuple[Check, str | None]:
    """The master address resolves here, and not to loopback where other machines' processes must reach
    host 0 through it. Also the IP address it stands for (None when the check fails).

    ``one_machine``: every host of the job is this machine; ``master_host``: this is host 0."""
    try:
        ip = resolve(addr)
    except NetworkError as e:
        return Check.failed(e.message, "name resolution: add the name to /etc/hosts or DNS on every host, or give "
                                       "init.master_addr as an IP address"), None
    shown = f"master {addr}" if ip == addr else f"master {addr} -> {ip}"
    if not is_loopback_ip(ip):
        return Check(f"{shown} (not loopback)"), ip
    if hosts == 1:
        return Check(f"{shown} (loopback: one host)"), ip
    if one_machine:
        return Check(f"{shown} (loopback: every host is this machine)"), ip
    if master_host:
        return Check(f"{shown} (loopback here, on host 0 itself)"), ip
    how = f"{addr} resolves to {ip} on this host" if ip != addr else f"{ip} is every host's own address"
    return Check.failed(f"the master address {addr} -> {ip} is loopback, but the job has {hosts} hosts: this host "
                        f"would dial itself, not host 0",
                        f"name resolution: {how} (/etc/hosts maps the name to 127.0.x.x?); give init.master_addr as "
                        f"host 0's address on the network, or map the name to it"), None


def check_route(ip: str, to: str | None = None) -> tuple[Check, str | None, str | None]:
    """A route from this host to ``ip`` (``to``: whose address it is, when not the master's): the check,
    this host's address on the route and its interface."""
    what = f"host {to} ({ip})" if to else f"the master {ip}"
    try:
        source = route_source(ip)
    except NetworkError as e:
        return Check.failed(f"no route from this host to {what}" if to else e.message,
                            f"interface or routing: `ip route get {ip}` says where packets for it go"), None, None
    name = interface_of(source)
    if name is None:
        return Check.failed(f"the route to {what} leaves from {source}, which no interface of this host holds",
                            f"interface: check `ip -br addr` and `ip route get {ip}`"), source, None
    return Check(f"route{f' to host {to}' if to else ''} via {name} ({source})"), source, name


def check_interface(choice: InterfaceChoice | None, route_ifname: str | None, spec_ifname: str | None,
                    given: str | None, backend: str, interfaces: frozenset[str], own_name_ip: str | None,
                    one_machine: bool, pick_interface: bool = True) -> Check:
    """The interface gloo/NCCL will use and who chose it. With gloo, which binds by name, a named
    interface this host lacks fails; left to itself, gloo listens on the address this host's name
    resolves to (``own_name_ip``), which must not be loopback.

    ``choice``: the runner's (runner.worker.network.network_choice); ``given``: GLOO_SOCKET_IFNAME as the
    user set it (backend.env or the environment); ``one_machine``: every host is this machine."""
    chosen = choice.env.get("GLOO_SOCKET_IFNAME") if choice else None
    used = spec_ifname or chosen or given
    if used is None:
        if one_machine:
            return Check("loopback between the processes (every host is this machine)")
        why = "backend.pick_interface=false" if not pick_interface else \
            "the runner found no route to another host: the master is loopback here and the others are unnamed"
        if backend == "gloo" and own_name_ip is not None and is_loopback_ip(own_name_ip):
            route = f" ({route_ifname})" if route_ifname and route_ifname != "lo" else ""
            return Check.failed(f"gloo picks its interface itself ({why}) and would listen on {own_name_ip}, the "
                                f"loopback address this host's name resolves to: the other hosts cannot connect to it",
                                ("interface: leave backend.pick_interface=true (the route's interface), " if not
                                 pick_interface else "interface: name the hosts (topology.hosts), ")
                                + f"or set backend.socket_ifname{route}; or map this host's name to its network "
                                  f"address (/etc/hosts)")
        return Check(f"gloo/NCCL pick their interface themselves ({why})")
    why = "backend.socket_ifname" if spec_ifname else "the route's" if chosen else "GLOO_SOCKET_IFNAME set by the user"
    if backend == "gloo":
        missing = [n for n in used.split(",") if n not in interfaces]
        if missing:
            return Check.failed(f"interface {', '.join(missing)} ({why}) is not on this host (it has "
                                f"{', '.join(sorted(interfaces))})",
                                "interface: name one of this host's" + (f", e.g. the route's: {route_ifname}"
                                                                        if route_ifname else ""))
    if used == route_ifname or route_ifname is None:
        return Check(f"gloo/NCCL on {used} ({why})")
    return Check(f"gloo/NCCL on {used} ({why}; the route leaves via {route_ifname})")


def hold_port(bind: str, port: int) -> tuple[socket.socket | None, Check]:
    """Listen on ``port`` for the checks (a task that serves the store itself later, one task per
    process): the port is free, and dialing master:port from here reaches it. Close the socket before
    the store binds the port."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((bind, port))
        s.listen(16)
    except OSError as e:
        s.close()
        return None, Check.failed(f"port {port} is not free on this host (host 0): cannot listen on {bind}:{port} "
                                  f"({e.strerror})", "another job holds the port; leave init.master_port=0 (a free "
                                  "port per run), or pick another")
    return s, Check(f"port {port} free")


def connect_failure(ip: str, port: int, err: OSError, ifname: str | None, waited_s: float, serving_here: bool) -> Check:
    """Why connecting to ``ip:port`` failed, in words, with the likely cause."""
    via = f" (reached via {ifname})" if ifname else ""
    if isinstance(err, ConnectionRefusedError):
        if serving_here:
            return Check.failed(f"this host (host 0) serves the rendezvous on port {port}, but port {port} on {ip} "
                                f"refused the connection: the master address leads elsewhere",
                                "init.master_addr must be host 0's address (or leave it out)")
        tried = f" for {waited_s:.0f} s" if waited_s >= 1 else ""
        return Check.failed(f"port {port} on {ip}{via} refused the connection{tried}: nothing listens there",
                            "is host 0 started, and is init.master_addr host 0's address? a firewall that rejects?")
    if isinstance(err, TimeoutError):  # socket.timeout is TimeoutError
        return Check.failed(f"no answer from {ip}:{port} within {CONNECT_ATTEMPT_S:.0f} s{via}",
                            f"firewall: something drops packets to port {port} (host 0 must accept the master port, "
                            f"and gloo/NCCL's own ports, from every host); or the route leads nowhere: "
                            f"`ip route get {ip}`")
    if err.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return Check.failed(f"{ip}:{port} is unreachable from this host ({err.strerror}){via}",
                            f"interface or routing: `ip route get {ip}`; or a firewall that rejects as unreachable")
    return Check.failed(f"cannot connect to {ip}:{port} ({err.strerror or err}){via}", "firewall or routing")


def check_reachable(ip: str, port: int, window_s: float, ifname: str | None = None,
                    serving_here: bool = False) -> Check:
    """A TCP connection to ``ip:port`` opens. A refused one is tried again for ``window_s`` (host 0 may be
    starting still), and so is one reset while it opened (host 0 hands the port from its own checks, which hold it,
    to the store: a connection caught in the first socket's queue is reset), unless this host serves the port
    itself; timeouts and unreachable networks are not."""
    start = time.monotonic()
    try:
        retry(lambda: socket.create_connection((ip, port), timeout=CONNECT_ATTEMPT_S).close(),
              () if serving_here else (ConnectionRefusedError, ConnectionResetError), window_s, REFUSED_AGAIN_S)
    except OSError as e:
        return connect_failure(ip, port, e, ifname, time.monotonic() - start, serving_here)
    return Check(f"port {port} {'free and served here' if serving_here else 'reachable'}")


def check_init_folder(folder: Path) -> Check:
    """The init file's folder exists and this host can write there (it makes and removes a file)."""
    if not folder.is_dir():
        return Check.failed(f"the init file's folder {folder} does not exist on this host",
                            f"shared storage: init.dir must be a folder every host sees at the same path (mkdir -p "
                            f"{folder} there, or mount it here)")
    try:
        fd, name = tempfile.mkstemp(prefix=".preflight-", dir=folder)
        os.close(fd)
        os.unlink(name)
    except OSError as e:
        return Check.failed(f"the init file's folder {folder} is not writable from this host ({e.strerror})",
                            "permissions or a read-only mount: every host's processes write the init file")
    return Check(f"init file folder {folder} writable")


def check_devices(host: Host, device: DeviceKind, processes: int, need: int, have: int | None) -> Check:
    """The host has what the spec gives it: CPU processes always; GPUs: ``need`` visible, ``have`` are."""
    if device is not DeviceKind.cuda:
        return Check(f"{processes} CPU process(es) as the spec says")
    gpus = ",".join(map(str, host.gpus))
    if not have or have < need:
        return Check.failed(f"the spec gives this host {host.devices} GPU(s) (GPUs {gpus}), but "
                            f"torch.cuda.device_count() = {have or 0} here",
                            f"devices: at most {have or 0} here (topology.devices_per_node, or "
                            f"topology.hosts[{host.index}].gpus); or check CUDA_VISIBLE_DEVICES and the allocation's "
                            f"GPUs (--gpus-per-node)")
    return Check(f"{host.devices} GPU(s) as the spec says (GPUs {gpus} of {have})")


