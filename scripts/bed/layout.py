"""The plan of a bed, decided before anything is made (so that `down` can undo a partial `up`): its id, names,
subnets (the lan's, the decoys', the data network's), addresses and ports (:class:`Plan`), and every file it uses
under its state directory (:class:`Paths`)."""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import re
import secrets
import socket
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from bed.common import TestbedError, sh

NETNS_DIR = Path("/var/run/netns")
HOSTS_FILE = Path("/etc/hosts")
LAN_IF = "lan0"
DECOY_IF = "decoy0"
DATA_IF = "data0"  # the second network's interface (--data-network)
IFNAMSIZ = 15  # the longest Linux interface name
ID_HEX = 4
MAX_HOSTS = 200  # addresses .11 .. .210 of the /24

PREFIX_RE = re.compile(r"[a-z][a-z0-9]*")
# Paths go into slurm.conf and command lines unquoted: keep them plain.
SAFE_PATH_RE = re.compile(r"[A-Za-z0-9._/+-]+")


def free_port() -> int:
    """A TCP port free right now on every address of the root namespace (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Host:
    """One namespace host. ``name`` is at once the namespace, the host name and the Slurm node name."""

    index: int
    name: str
    addr: str
    veth: str  # the root-namespace end of the veth pair; the namespace end is LAN_IF
    decoy_addr: str | None
    data_addr: str | None = None  # on DATA_IF, the data subnet (--data-network)
    data_veth: str | None = None  # the root-namespace end of DATA_IF's veth pair, on the data bridge

    @property
    def netns_path(self) -> str:
        return str(NETNS_DIR / self.name)


@dataclass(frozen=True)
class Plan:
    """Everything `up` will create, decided before anything is created (so `down` can undo a partial `up`)."""

    id: str
    prefix: str
    state: str
    subnet: str
    decoy_subnet: str | None
    cpus: int
    slurm: bool
    ctl_port: int | None
    slurmd_port: int | None
    hosts: tuple[Host, ...]
    sshd: bool = False  # an sshd in every host (bed.sshd)
    slurmd_timeout: int = 30  # Slurm's SlurmdTimeout: a node whose slurmd is silent this long is marked down
    data_subnet: str | None = None  # the second network (--data-network): a bridge of its own, DATA_IF in every host

    @property
    def tag(self) -> str:
        """``<prefix><id>``: in every name this bed creates."""
        return f"{self.prefix}{self.id}"

    @property
    def bridge(self) -> str:
        return f"{self.tag}br"

    @property
    def bridge_addr(self) -> str:
        return str(ipaddress.ip_network(self.subnet)[1])

    @property
    def data_bridge(self) -> str:
        """The second network's bridge (it exists only where ``data_subnet`` is set)."""
        return f"{self.tag}db"

    @property
    def data_bridge_addr(self) -> str | None:
        return str(ipaddress.ip_network(self.data_subnet)[1]) if self.data_subnet else None

    @property
    def ctl_name(self) -> str:
        return f"{self.tag}ctl"

    @property
    def marker(self) -> str:
        """The comment that ends this bed's lines in /etc/hosts."""
        return f"# testbed:{self.tag}"

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Plan:
        hosts = tuple(Host(**h) for h in data.pop("hosts"))
        return cls(hosts=hosts, **data)


@dataclass(frozen=True)
class Paths:
    """Every file and folder a bed uses, all under its state directory."""

    root: Path

    plan = property(lambda self: self.root / "plan.json")
    description = property(lambda self: self.root / "testbed.json")
    rsh_agent = property(lambda self: self.root / "rsh-agent")
    logs = property(lambda self: self.root / "logs")
    pids = property(lambda self: self.root / "pids")
    munge = property(lambda self: self.root / "munge")
    munge_socket = property(lambda self: self.munge / "munge.socket")
    munge_key = property(lambda self: self.munge / "munge.key")
    slurm = property(lambda self: self.root / "slurm")
    slurm_conf = property(lambda self: self.root / "slurm.conf")
    plugstack = property(lambda self: self.slurm / "plugstack.conf")
    tmp = property(lambda self: self.root / "tmp")  # per-host TMPDIRs (rsh-agent)
    ssh = property(lambda self: self.root / "ssh")  # keys, sshd configurations, each host's own home (bed.sshd)
    ssh_config = property(lambda self: self.ssh / "ssh_config")
    known_hosts = property(lambda self: self.ssh / "known_hosts")
    home = property(lambda self: self.root / "home")  # a different folder on each host with sshd (bed.sshd)

    def pid_file(self, daemon: str) -> Path:
        return self.pids / f"{daemon}.pid"

    def netns_inode(self, host: str) -> Path:
        return self.pids / f"{host}.netns"

    def log(self, daemon: str) -> Path:
        return self.logs / f"{daemon}.log"

    def runtime(self) -> list[Path]:
        """What `down` removes (logs/ stays for a post-mortem)."""
        return [self.munge, self.slurm, self.pids, self.tmp, self.ssh, self.home, self.slurm_conf, self.rsh_agent,
                self.description]


def interface_names(tag: str, n_hosts: int) -> list[str]:
    """The root-namespace interfaces a bed of ``n_hosts`` hosts may make: both bridges and both veths of each host
    (Plan.bridge, Plan.data_bridge, Host.veth, Host.data_veth)."""
    return [f"{tag}br", f"{tag}db"] + [f"{tag}{kind}{i}" for i in range(1, n_hosts + 1) for kind in ("v", "d")]


def check_prefix(prefix: str, n_hosts: int) -> None:
    """Names must be DNS labels and Slurm node names, and the interface names must fit in IFNAMSIZ."""
    if not PREFIX_RE.fullmatch(prefix):
        raise TestbedError(f"--prefix {prefix!r}: use lowercase letters and digits, starting with a letter")
    longest = max(len(name) for name in interface_names(f"{prefix}{'0' * ID_HEX}", n_hosts))
    if longest > IFNAMSIZ:
        room = IFNAMSIZ - (longest - len(prefix))
        raise TestbedError(f"--prefix {prefix!r} is too long: interface names would be {longest} characters "
                           f"(Linux allows {IFNAMSIZ}); use at most {room} characters")


def used_networks() -> list[ipaddress.IPv4Network]:
    """IPv4 networks of the root namespace's addresses and routes (other beds' bridges included)."""
    nets = []
    for entry in json.loads(sh("ip", "-j", "-4", "addr", "show").stdout or "[]"):
        for a in entry.get("addr_info", []):
            nets.append(ipaddress.ip_network(f"{a['local']}/{a['prefixlen']}", strict=False))
    for r in json.loads(sh("ip", "-j", "-4", "route", "show", "table", "all").stdout or "[]"):
        with contextlib.suppress(ValueError):  # "default" and the like
            nets.append(ipaddress.ip_network(r.get("dst", "default"), strict=False))
    return nets


def nameservers() -> list[ipaddress.IPv4Address]:
    """The IPv4 name servers of /etc/resolv.conf."""
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/etc/resolv.conf").read_text().splitlines():
            words = line.split()
            if len(words) >= 2 and words[0] == "nameserver":
                with contextlib.suppress(ValueError):
                    addr = ipaddress.ip_address(words[1])
                    if addr.version == 4:
                        found.append(addr)
    return found


def pick_subnet(used: Sequence[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    """A random 10.x.y.0/24 overlapping none of ``used``."""
    for _ in range(1000):
        net = ipaddress.ip_network(f"10.{secrets.randbelow(254) + 1}.{secrets.randbelow(256)}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise TestbedError("no free 10.x.y.0/24 subnet found")


def name_taken(tag: str) -> bool:
    """Whether some namespace, interface or /etc/hosts line already carries ``tag``."""
    links = sh("ip", "-o", "link", "show").stdout
    return (any(p.name.startswith(tag) for p in NETNS_DIR.glob("*")) or f" {tag}" in links
            or f"testbed:{tag}" in HOSTS_FILE.read_text())


def make_plan(args: argparse.Namespace, state: Path) -> Plan:
    """Choose id, subnets and ports. Called under machine_lock so that the subnet is claimed before release."""
    for _ in range(100):
        bed_id = secrets.token_hex(ID_HEX // 2)
        if not name_taken(f"{args.prefix}{bed_id}"):
            break
    else:
        raise TestbedError("no unused id found")
    used = used_networks() + [ipaddress.ip_network(a) for a in nameservers()]
    subnet = pick_subnet(used)
    decoy = pick_subnet([*used, subnet]) if args.decoy else None
    data = pick_subnet([*used, subnet, *([decoy] if decoy else [])]) if args.data_network else None
    tag = f"{args.prefix}{bed_id}"
    hosts = tuple(
        Host(index=i, name=f"{tag}h{i}", addr=str(subnet[10 + i]), veth=f"{tag}v{i}",
             decoy_addr=str(decoy[10 + i]) if decoy else None,
             data_addr=str(data[10 + i]) if data else None, data_veth=f"{tag}d{i}" if data else None)
        for i in range(1, args.hosts + 1)
    )
    ctl_port = free_port() if args.slurm else None
    slurmd_port = None
    while args.slurm and slurmd_port in (None, ctl_port):
        slurmd_port = free_port()
    return Plan(id=bed_id, prefix=args.prefix, state=str(state), subnet=str(subnet),
                decoy_subnet=str(decoy) if decoy else None, cpus=args.cpus, slurm=args.slurm,
                ctl_port=ctl_port, slurmd_port=slurmd_port, hosts=hosts, sshd=args.sshd,
                slurmd_timeout=args.slurmd_timeout, data_subnet=str(data) if data else None)


def load_plan(paths: Paths) -> Plan | None:
    try:
        return Plan.from_json(json.loads(paths.plan.read_text()))
    except FileNotFoundError:
        return None


def find_host(plan: Plan, name_or_addr: str) -> Host:
    for h in plan.hosts:
        if name_or_addr in (h.name, h.addr, f"h{h.index}"):
            return h
    names = ", ".join(h.name for h in plan.hosts)
    raise TestbedError(f"no host {name_or_addr!r} in this bed (hosts: {names})")
