"""The bed's network: a bridge, one namespace per host joined to it by a veth pair (and a decoy interface that
routes nowhere, and a second veth pair on a second bridge: the data network), the hosts' names in /etc/hosts, and
taking all of it down again."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from pathlib import Path

from bed.common import TestbedError, machine_lock, sh
from bed.layout import DATA_IF, DECOY_IF, HOSTS_FILE, LAN_IF, Host, Paths, Plan, nameservers
from bed.processes import record_netns


def create_bridge(plan: Plan) -> None:
    """The lan's bridge and, with a data network, the data bridge: their addresses claim the subnets (the next
    bed's used_networks() sees them)."""
    add_bridge(plan.bridge, plan.bridge_addr, plan.subnet)
    if plan.data_subnet:
        add_bridge(plan.data_bridge, plan.data_bridge_addr, plan.data_subnet)


def add_bridge(name: str, addr: str, subnet: str) -> None:
    """A bridge in the root namespace with the subnet's first address, up."""
    prefixlen = ipaddress.ip_network(subnet).prefixlen
    sh("ip", "link", "add", name, "type", "bridge")
    sh("ip", "addr", "add", f"{addr}/{prefixlen}", "dev", name)
    sh("ip", "link", "set", name, "up")


def add_decoy(host: Host, decoy_subnet: str) -> str:
    """An UP link ``decoy0`` that reaches nothing: ``dummy`` or, where the kernel lacks it, ``ifb``.
    Returns the kind."""
    ns = ("ip", "-n", host.name)
    for kind in ("dummy", "ifb"):
        if sh(*ns, "link", "add", DECOY_IF, "type", kind, check=False).returncode == 0:
            break
    else:
        raise TestbedError(f"this kernel can make neither a dummy nor an ifb link for {DECOY_IF}")
    prefixlen = ipaddress.ip_network(decoy_subnet).prefixlen
    sh(*ns, "addr", "add", f"{host.decoy_addr}/{prefixlen}", "dev", DECOY_IF)
    sh(*ns, "link", "set", DECOY_IF, "up")
    return kind


def add_data_link(plan: Plan, host: Host) -> None:
    """``data0``: a veth on the data bridge with the host's data address. Only the on-link route its address gives:
    the default route stays the lan's, so that cutting the data network leaves the lan as it was."""
    ns = ("ip", "-n", host.name)
    sh("ip", "link", "add", host.data_veth, "type", "veth", "peer", "name", DATA_IF, "netns", host.name)
    sh("ip", "link", "set", host.data_veth, "master", plan.data_bridge, "up")
    prefixlen = ipaddress.ip_network(plan.data_subnet).prefixlen
    sh(*ns, "addr", "add", f"{host.data_addr}/{prefixlen}", "dev", DATA_IF)
    sh(*ns, "link", "set", DATA_IF, "up")


def create_host(plan: Plan, paths: Paths, host: Host) -> str | None:
    """Namespace, decoy (first, so it sorts first), veth on the bridge, addresses, routes, then the data network's
    veth (after lan0, so that the lan stays the first real interface). Returns the decoy kind."""
    ns = ("ip", "-n", host.name)
    sh("ip", "netns", "add", host.name)
    record_netns(paths, host)
    decoy_kind = add_decoy(host, plan.decoy_subnet) if plan.decoy_subnet else None
    sh("ip", "link", "add", host.veth, "type", "veth", "peer", "name", LAN_IF, "netns", host.name)
    sh("ip", "link", "set", host.veth, "master", plan.bridge, "up")
    prefixlen = ipaddress.ip_network(plan.subnet).prefixlen
    sh(*ns, "addr", "add", f"{host.addr}/{prefixlen}", "dev", LAN_IF)
    sh(*ns, "link", "set", "lo", "up")
    sh(*ns, "link", "set", LAN_IF, "up")
    sh(*ns, "route", "add", "default", "via", plan.bridge_addr)
    for server in nameservers():
        if not server.is_loopback:
            # unreachable from here (nothing forwards beyond the bridge): make a lookup that gets past
            # /etc/hosts fail at once instead of after the resolver's timeouts (5 s per try)
            sh(*ns, "route", "add", "unreachable", f"{server}/32")
    if plan.data_subnet:
        add_data_link(plan, host)
    return decoy_kind


def hosts_lines(plan: Plan) -> list[str]:
    entries = [(plan.bridge_addr, plan.ctl_name)] + [(h.addr, h.name) for h in plan.hosts]
    return [f"{addr}\t{name}\t{plan.marker}" for addr, name in entries]


def edit_hosts_file(keep: Callable[[str], bool], add: Sequence[str] = ()) -> None:
    """Rewrite /etc/hosts in place (it may be a bind mount): keep the lines ``keep(line)`` accepts, append ``add``."""
    with machine_lock(), open(HOSTS_FILE, "r+") as f:
        lines = [line for line in f.read().splitlines() if keep(line)] + list(add)
        f.seek(0)
        f.write("\n".join(lines) + "\n")
        f.truncate()


def delete_network(plan: Plan) -> None:
    """Namespaces (their veth ends go with them), leftover veths, the bridges. Missing pieces are fine."""
    for h in plan.hosts:
        if Path(h.netns_path).exists():
            sh("ip", "netns", "del", h.name, check=False)
    veths = [h.veth for h in plan.hosts] + [h.data_veth for h in plan.hosts if h.data_veth]
    for name in veths + [plan.bridge] + ([plan.data_bridge] if plan.data_subnet else []):
        if Path("/sys/class/net", name).exists():
            sh("ip", "link", "del", name, check=False)
