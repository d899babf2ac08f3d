"""The bed's network: a bridge, one namespace per host joined to it by a veth pair (and a decoy interface that
routes nowhere), the hosts' names in /etc/hosts, and taking all of it down again."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from pathlib import Path

from bed.common import TestbedError, machine_lock, sh
from bed.layout import DECOY_IF, HOSTS_FILE, LAN_IF, Host, Paths, Plan, nameservers
from bed.processes import record_netns


def create_bridge(plan: Plan) -> None:
    prefixlen = ipaddress.ip_network(plan.subnet).prefixlen
    sh("ip", "link", "add", plan.bridge, "type", "bridge")
    sh("ip", "addr", "add", f"{plan.bridge_addr}/{prefixlen}", "dev", plan.bridge)
    sh("ip", "link", "set", plan.bridge, "up")


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


def create_host(plan: Plan, paths: Paths, host: Host) -> str | None:
    """Namespace, decoy (first, so it sorts first), veth on the bridge, addresses, routes. Returns the decoy kind."""
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
    """Namespaces (their veth ends go with them), leftover veths, the bridge. Missing pieces are fine."""
    for h in plan.hosts:
        if Path(h.netns_path).exists():
            sh("ip", "netns", "del", h.name, check=False)
    for name in [h.veth for h in plan.hosts] + [plan.bridge]:
        if Path("/sys/class/net", name).exists():
            sh("ip", "link", "del", name, check=False)
