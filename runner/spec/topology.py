"""Hosts as the plan sees them: the topology config resolved into plain records."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator
from dataclasses import dataclass

from runner.spec.problems import Problem
from runner.spec.schema import HostConfig, TopologyConfig

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
    return _grid_hosts(cfg, problems) if cfg.hosts is None else _listed_hosts(cfg, cfg.hosts, problems)


def _grid_hosts(cfg: TopologyConfig, problems: list[Problem]) -> tuple[Host, ...]:
    """``topology.nodes`` unnamed hosts of ``topology.devices_per_node`` devices each."""
    if cfg.nodes is None or cfg.devices_per_node is None:
        missing = [k for k in ("nodes", "devices_per_node") if getattr(cfg, k) is None]
        problems.append(Problem(
            f"topology.{missing[0]}",
            f"not set: the topology needs either topology.hosts or both nodes and devices_per_node "
            f"(missing: {', '.join(missing)})",
            "pick a shape, e.g. topology=2x2, or set topology.nodes=2 topology.devices_per_node=4",
        ))
        return ()
    start = len(problems)
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
    return tuple(Host(index=i, name=None, addr=None, devices=d, gpus=gpus) for i in range(cfg.nodes))


def _listed_hosts(cfg: TopologyConfig, listed: list[HostConfig], problems: list[Problem]) -> tuple[Host, ...]:
    """``topology.hosts`` (``listed``), each host checked: its device count, its names, listed once, its GPUs."""
    if not listed:
        problems.append(Problem("topology.hosts", "is an empty list",
                                "list at least one host, or set it to null and use topology.nodes"))
        return ()
    start = len(problems)
    if cfg.nodes is not None and cfg.nodes != len(listed):
        problems.append(Problem(
            "topology.nodes",
            f"is {cfg.nodes} but topology.hosts lists {len(listed)} host(s)",
            f"set topology.nodes={len(listed)} or null, or list hosts on top of topology=custom instead of a grid shape",
        ))
    hosts: list[Host] = []
    seen: dict[str, int] = {}  # name or address -> the first host listing it
    for i, h in enumerate(listed):
        key = f"topology.hosts[{i}]"
        devices = _device_count(key, h, cfg.devices_per_node, problems)
        if devices is None:
            continue
        problems.extend(_name_problems(key, h))
        problems.extend(_listed_twice(key, i, h, seen))
        gpus = tuple(h.gpus) if h.gpus is not None else tuple(range(devices))
        if h.gpus is not None:
            problems.extend(_gpu_problems(key, gpus, devices))
        hosts.append(Host(index=i, name=h.name, addr=h.addr, devices=devices, gpus=gpus))
    if len(problems) > start:
        return ()
    return tuple(hosts)


def _device_count(key: str, host: HostConfig, per_node: int | None, problems: list[Problem]) -> int | None:
    """A listed host's device count: its own, else topology.devices_per_node (``per_node``); None, with its problem
    appended, when neither gives one of at least 1."""
    devices = host.devices if host.devices is not None else per_node
    if devices is None:
        problems.append(Problem(f"{key}.devices", "not set and topology.devices_per_node is not set either",
                                f"give the host a count: {key}.devices=2"))
    elif devices < 1:
        problems.append(Problem(f"{key}.devices", f"must be at least 1, got {devices}",
                                "drop the host from the list instead of giving it no devices"))
    else:
        return devices
    return None


def _name_problems(key: str, host: HostConfig) -> Iterator[Problem]:
    """A listed host's name and address reach command lines: host names or IP literals only."""
    for field_name in ("name", "addr"):
        value = getattr(host, field_name)
        if value is not None and not is_valid_host(value):
            yield Problem(f"{key}.{field_name}", f"{value!r} is not a host name or IP address",
                          "use letters, digits, '-', '_' and '.', or an IPv4/IPv6 literal; no spaces or shell characters")


def _listed_twice(key: str, index: int, host: HostConfig, seen: dict[str, int]) -> Iterator[Problem]:
    """A machine listed twice (by the same address, else name); ``seen`` remembers the first listing of each."""
    ident = host.addr or host.name
    if ident is None:
        return
    if ident in seen:
        yield Problem(key, f"{ident!r} is listed twice (also topology.hosts[{seen[ident]}])",
                      "list each machine once and give it all its devices")
    seen.setdefault(ident, index)


def _gpu_problems(key: str, gpus: tuple[int, ...], devices: int) -> Iterator[Problem]:
    """A listed host's GPU indices: one per device, each once, none negative."""
    if len(gpus) != devices:
        yield Problem(f"{key}.gpus", f"lists {len(gpus)} GPU(s) {list(gpus)} for {devices} device(s)",
                      f"list exactly {devices} GPU indices, or drop gpus to use 0..{devices - 1}")
    if len(set(gpus)) != len(gpus):
        yield Problem(f"{key}.gpus", f"has duplicates: {list(gpus)}", "each process needs its own GPU")
    if any(g < 0 for g in gpus):
        yield Problem(f"{key}.gpus", f"has negative indices: {list(gpus)}",
                      "GPU indices count from 0, as nvidia-smi numbers them")
