"""Hosts as the plan sees them: the topology config resolved into plain records."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from runner.spec.problems import Problem
from runner.spec.schema import TopologyConfig

# RFC 1123 host names (dots allowed) or IP literals; nothing a shell would read as syntax.
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9_-]{0,62}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9_-]{0,62}[A-Za-z0-9])?)*\.?$")


@dataclass(frozen=True, slots=True)
class Host:
    """One host of a resolved topology. ``name`` None: the launcher decides which machine it is."""

    index: int  # = node rank
    name: str | None
    addr: str | None
    devices: int
    gpus: tuple[int, ...]

    @property
    def label(self) -> str:
        """How the plan and the dry run name this host."""
        return self.name if self.name is not None else f"node{self.index}"

    @property
    def reach(self) -> str | None:
        """The address other hosts use for it, if the spec says."""
        return self.addr if self.addr is not None else self.name


def is_valid_host(value: str) -> bool:
    """A host name or IP address that can safely reach a command line."""
    try:
        ipaddress.ip_address(value)
        return True
    except ValueError:
        return bool(_HOSTNAME.match(value))


def is_loopback(value: str) -> bool:
    """localhost, 127.0.0.0/8 or ::1 (by name or literal; no name resolution)."""
    if value.lower() in ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"):
        return True
    try:
        return ipaddress.ip_address(value).is_loopback
    except ValueError:
        return False


def resolve_hosts(cfg: TopologyConfig, problems: list[Problem]) -> tuple[Host, ...]:
    """Turn the grid shorthand or the explicit host list into Host records, noting what is wrong.

    Problems are appended to ``problems``; the hosts returned are usable only when none was added.
    """
    start = len(problems)
    if cfg.hosts is None:
        if cfg.nodes is None or cfg.devices_per_node is None:
            missing = [k for k in ("nodes", "devices_per_node") if getattr(cfg, k) is None]
            problems.append(Problem(
                f"topology.{missing[0]}",
                f"not set: the topology needs either topology.hosts or both nodes and devices_per_node "
                f"(missing: {', '.join(missing)})",
                "pick a shape, e.g. topology=2x2, or set topology.nodes=2 topology.devices_per_node=4",
            ))
            return ()
        if cfg.nodes < 1:
            problems.append(Problem("topology.nodes", f"must be at least 1, got {cfg.nodes}",
                                    "a job runs on one host or more: topology.nodes=1"))
        if cfg.devices_per_node < 1:
            problems.append(Problem("topology.devices_per_node", f"must be at least 1, got {cfg.devices_per_node}",
                                    "each host runs one process per device: topology.devices_per_node=1 or more"))
        if len(problems) > start:
            return ()
        d = cfg.devices_per_node
        gpus = tuple(range(d))
        return tuple(Host(i, None, None, d, gpus) for i in range(cfg.nodes))

    if not cfg.hosts:
        problems.append(Problem("topology.hosts", "is an empty list", "list at least one host, or set it to null and use topology.nodes"))
        return ()
    if cfg.nodes is not None and cfg.nodes != len(cfg.hosts):
        problems.append(Problem(
            "topology.nodes",
            f"is {cfg.nodes} but topology.hosts lists {len(cfg.hosts)} host(s)",
            f"set topology.nodes={len(cfg.hosts)} or null, or list hosts on top of topology=custom instead of a grid shape",
        ))
    hosts: list[Host] = []
    seen: dict[str, int] = {}
    for i, h in enumerate(cfg.hosts):
        key = f"topology.hosts[{i}]"
        devices = h.devices if h.devices is not None else cfg.devices_per_node
        if devices is None:
            problems.append(Problem(f"{key}.devices", "not set and topology.devices_per_node is not set either",
                                    f"give the host a count: {key}.devices=2"))
            continue
        if devices < 1:
            problems.append(Problem(f"{key}.devices", f"must be at least 1, got {devices}",
                                    "drop the host from the list instead of giving it no devices"))
            continue
        for field_name in ("name", "addr"):
            value = getattr(h, field_name)
            if value is not None and not is_valid_host(value):
                problems.append(Problem(
                    f"{key}.{field_name}", f"{value!r} is not a host name or IP address",
                    "use letters, digits, '-', '_' and '.', or an IPv4/IPv6 literal; no spaces or shell characters",
                ))
        ident = h.addr or h.name
        if ident is not None:
            if ident in seen:
                problems.append(Problem(f"{key}", f"{ident!r} is listed twice (also topology.hosts[{seen[ident]}])",
                                        "list each machine once and give it all its devices"))
            seen.setdefault(ident, i)
        gpus = tuple(h.gpus) if h.gpus is not None else tuple(range(devices))
        if h.gpus is not None:
            if len(gpus) != devices:
                problems.append(Problem(f"{key}.gpus", f"lists {len(gpus)} GPU(s) {list(gpus)} for {devices} device(s)",
                                        f"list exactly {devices} GPU indices, or drop gpus to use 0..{devices - 1}"))
            if len(set(gpus)) != len(gpus):
                problems.append(Problem(f"{key}.gpus", f"has duplicates: {list(gpus)}", "each process needs its own GPU"))
            if any(g < 0 for g in gpus):
                problems.append(Problem(f"{key}.gpus", f"has negative indices: {list(gpus)}",
                                        "GPU indices count from 0, as nvidia-smi numbers them"))
        hosts.append(Host(i, h.name, h.addr, devices, gpus))
    if len(problems) > start:
        return ()
    return tuple(hosts)
