"""Which network interface a host's processes use to reach the others.

Gloo and NCCL pick an interface by themselves, from the host name (which may resolve to 127.0.1.1, or
to an address the host does not have) or from the first interface up; on a multi-host job that is
often the wrong one, and the job hangs or fails with "connection refused" on 127.0.0.1. The runner
asks the kernel instead: the interface of the route to the master address is the one the other hosts
are reached on. The user's own choice wins: ``backend.socket_ifname``, ``backend.env`` or the
variables already in the environment.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import psutil

from runner.common.errors import HintedError
from runner.environments.process import SOCKET_IFNAME_VARIABLES as VARIABLES
from runner.environments.process import ProcessEnvironment
from runner.plan.processes import Deferred, Plan


@dataclass(frozen=True)
class InterfaceChoice:
    env: dict[str, str]  # what to set in every process of this host
    note: str  # what was chosen and why, for the ranks' logs


class NetworkError(HintedError):
    """What is wrong with this host's network for the job; ``hint`` says what to do (runner.common.errors)."""


def resolve(addr: str) -> str:
    """The IP address a host name or address stands for (IPv4 first, as torch's TCP store does)."""
    try:
        infos = socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise NetworkError(f"master address {addr!r} does not resolve ({e.strerror})",
                           "use an address, or fix name resolution (/etc/hosts, DNS) on every host") from None
    infos.sort(key=lambda i: i[0] != socket.AF_INET)
    return infos[0][4][0]


def route_source(ip: str) -> str:
    """This host's address on the route to ``ip`` (no packet is sent: a UDP connect only picks a route)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect((ip, 9))
        except OSError as e:
            raise NetworkError(f"no route from this host to the master {ip} ({e.strerror})",
                               f"check the network (ip route get {ip})") from None
        return s.getsockname()[0]


def interface_of(addr: str) -> str | None:
    for name, nics in psutil.net_if_addrs().items():
        if any(n.address.split("%")[0] == addr for n in nics if n.family in (socket.AF_INET, socket.AF_INET6)):
            return name
    return None


def network_choice(plan: Plan, node_rank: int, environment: ProcessEnvironment) -> InterfaceChoice | None:
    """The interface host ``node_rank``'s processes use to reach the others (multi-host jobs), and why."""
    if len(plan.job.hosts) < 2 or isinstance(plan.master_addr, Deferred):
        return None
    backend = plan.job.spec.backend
    if not backend.pick_interface and not backend.socket_ifname:
        return InterfaceChoice({}, "network: backend.pick_interface=false: gloo and NCCL choose their interface")
    peers = [h.reach for h in plan.job.hosts if h.index != node_rank and h.reach]
    return choose_interface(plan.master_addr, backend.socket_ifname, backend.env, environment.socket_ifnames, peers)


def choose_interface(master_addr: str, spec_ifname: str | None, spec_env: Mapping[str, str],
                     environ: Mapping[str, str], peers: Sequence[str] = ()) -> InterfaceChoice:
    """GLOO/NCCL_SOCKET_IFNAME for this host's processes in a multi-host job, and why. ``environ``: what
    the user set of them in the environment (runner.environments.process).

    ``peers``: the other hosts' names or addresses, for the master itself, whose own name may resolve to
    a loopback address there (Debian's ``127.0.1.1 thishost``): then the route to a peer decides."""
    if spec_ifname:
        return InterfaceChoice({v: spec_ifname for v in VARIABLES}, f"network: interface {spec_ifname} "
                               f"(backend.socket_ifname)")
    given = {v: (spec_env.get(v) or environ.get(v)) for v in VARIABLES}
    if all(given.values()):
        where = ", ".join(f"{v}={given[v]}" for v in VARIABLES)
        return InterfaceChoice({}, f"network: {where} as set by the user (the runner's choice is off)")
    target, ip = master_addr, resolve(master_addr)
    if ipaddress.ip_address(ip).is_loopback:
        outside = [(peer, peer_ip) for peer in peers if not ipaddress.ip_address(peer_ip := resolve(peer)).is_loopback]
        if not outside:
            # validation lets a loopback master through only when every "host" is this machine
            return InterfaceChoice({}, f"network: the master {master_addr} is this machine's loopback, so are the "
                                       f"other hosts: no interface to choose")
        target, ip = outside[0]
    source = route_source(ip)
    name = interface_of(source)
    if name is None:
        raise NetworkError(f"the route to the master {ip} leaves from {source}, which no interface holds",
                           f"check the interfaces and routes of this host (ip -br addr; ip route get {ip})")
    env = {v: name for v in VARIABLES if not given[v]}
    kept = [f"{v}={given[v]} (user's)" for v in VARIABLES if given[v]]
    chosen = ", ".join([*(f"{v}={name}" for v in env), *kept])
    to = f"the master {master_addr}" if target == master_addr else \
        f"host {target} (the master {master_addr} is this host, and resolves to loopback here)"
    return InterfaceChoice(env, f"network: {chosen}: {name} ({source}) is the interface of the route to {to}"
                                + (f" ({ip})" if ip != target else ""))
