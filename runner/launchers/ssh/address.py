"""The address the other hosts of a launcher=ssh job dial for a host that the spec names without ``addr:``: the one ssh
itself would connect to.

A host named as ssh knows it (``Host box1`` / ``HostName 10.0.0.11`` in ~/.ssh/config, or launcher.ssh.config_file)
is often a name no resolver knows: neither this machine's nor the hosts'. ``ssh -G NAME`` (with the launch's ssh
options) prints the configuration ssh would use, without connecting; its ``hostname`` is the address. Where it gives
the name back unchanged, ssh resolves the name itself, and so do the hosts: the name stays. The launch pins what it
found into the run's spec (runner.spec.pins), so every host's `run` plans with the same addresses, and the dry run
and launch.txt say which address was chosen and why (:class:`HostAddress`)."""

from __future__ import annotations

import dataclasses
import subprocess
from dataclasses import dataclass

from runner.spec.topology import Host, is_valid_host

ASK_S = 10.0  # `ssh -G` reads configuration files only; a stuck Match exec is refused after this


@dataclass(frozen=True, kw_only=True)
class HostAddress:
    """The address the other hosts dial for host ``index``, and why that one."""

    index: int
    name: str | None
    addr: str
    how: str  # "topology.hosts[1].addr", "ssh -G box1: HostName", ...
    found: bool  # the launch found it (ssh -G); False: the spec gave it, or the name is the address

    def line(self) -> str:
        return f"host {self.index} ({self.name or self.addr}) is dialled at {self.addr}: {self.how}"


def ssh_hostname(base: list[str], name: str) -> tuple[str | None, str]:
    """What ``ssh -G`` (with the options ``base``: runner.launchers.ssh.ssh_base) says ``name``'s hostname is, or None,
    and what went wrong."""
    argv = [base[0], "-G", *base[1:], "--", name]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=ASK_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{argv[0]} -G: {e}"
    if done.returncode != 0:
        said = " / ".join(line.strip() for line in done.stderr.splitlines() if "Pseudo-terminal" not in line)
        return None, f"{argv[0]} -G exited {done.returncode}: {said[-200:] or 'no reason given'}"
    for line in done.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key == "hostname" and value.strip():
            return value.strip(), ""
    return None, f"{argv[0]} -G said no hostname"


def host_address(host: Host, base: list[str]) -> HostAddress:
    """Where the other hosts dial ``host`` (the module docstring)."""
    if host.addr is not None:
        return HostAddress(index=host.index, name=host.name, addr=host.addr, how=f"topology.hosts[{host.index}].addr",
                           found=False)
    assert host.name is not None, "launcher=ssh names every host (SshLauncher.job_problems)"
    hostname, why_not = ssh_hostname(base, host.name)
    if hostname is None:
        return HostAddress(index=host.index, name=host.name, addr=host.name, found=False,
                           how=f"its name ({why_not}); set topology.hosts[{host.index}].addr to choose")
    if hostname.lower() == host.name.lower() or not is_valid_host(hostname):
        return HostAddress(index=host.index, name=host.name, addr=host.name, found=False,
                           how=f"its name (ssh -G {host.name} names no other HostName; the hosts resolve it)")
    return HostAddress(index=host.index, name=host.name, addr=hostname, found=True,
                       how=f"ssh -G {host.name}: HostName {hostname} (the name is ssh's alias)")


def host_addresses(hosts: tuple[Host, ...], base: list[str]) -> tuple[HostAddress, ...]:
    return tuple(host_address(h, base) for h in hosts)


def explained(host: Host, base: list[str]) -> HostAddress:
    """:func:`host_address` of a host of the pinned spec, whose ``addr`` may be one the launch found: said as found
    where ``ssh -G`` gives that very address for its name."""
    if host.addr is not None and host.name is not None and host.addr != host.name:
        hostname, _ = ssh_hostname(base, host.name)
        if hostname == host.addr:
            return host_address(dataclasses.replace(host, addr=None), base)
    return host_address(host, base)
