#!/usr/bin/env python3
"""A test bed of "hosts" on one Linux machine: network namespaces on a bridge, optionally a real Slurm cluster.

Run as root. Subcommands::

    testbed.py up   --state DIR [--hosts N] [--cpus C] [--slurm] [--decoy] [--prefix P]
    testbed.py down --state DIR
    testbed.py env  --state DIR
    testbed.py exec --state DIR HOST -- CMD...

What ``up`` builds (``<p>`` is the prefix, ``<id>`` a random 4-hex-digit id, so that several beds can run at once):

* a bridge ``<p><id>br`` in the root namespace with address x.y.z.1/24 on a random 10.x.y.0/24 subnet that no
  interface or route of the machine uses;
* host i (1-based): network namespace ``<p><id>h<i>`` (also its host name and Slurm node name), joined to the
  bridge by a veth pair (``<p><id>v<i>`` in the root namespace, ``lan0`` inside) with address x.y.z.(10+i)/24,
  ``lo`` up and a default route via the bridge. Hosts reach each other over the bridge (layer 2) and the root
  namespace directly, so no ip_forward and no firewall change are needed. Nothing beyond is reachable, DNS
  servers included: they get an ``unreachable`` route, so that a name missing from /etc/hosts fails at once;
* with ``--decoy``: in every namespace, before ``lan0`` (so it is listed first), an UP interface ``decoy0`` with
  an address on another subnet that reaches nothing: a ``dummy`` link, or an ``ifb`` link where the kernel has
  no dummy driver (both drop what is sent to them);
* lines ``ADDR NAME  # testbed:<p><id>`` in /etc/hosts for every host and for ``<p><id>ctl`` (the bridge
  address), so the names resolve everywhere, namespaces included (they share the mount namespace);
* ``DIR/rsh-agent``: an ssh look-alike for Open MPI's ``plm_rsh_agent`` that runs the command in the host's
  namespace (``nsenter --net``) with TMPDIR=DIR/tmp/HOST; the description's ``mpirun_args`` say what else
  mpirun needs (see :func:`mpirun_args`);
* with ``--slurm``: a munged, a slurmctld (root namespace) and one slurmd per host (inside its namespace), all
  with their configuration, sockets, state, logs and PID files under DIR, on free ports picked at run time.
  slurmctld refuses to run unless the host name is SlurmctldHost's ("This host (vm/vm) not a valid
  controller"), so it runs in a UTS namespace of its own named ``<p><id>ctl``. The hosts keep the machine's
  host name (only the network is theirs): ``hostname`` says the same everywhere, as DESIGN.md's
  "host name resolves to 127.0.x.x" case wants.

``up`` prints a JSON description (also written to DIR/testbed.json) and exits 0, or tears down what it made and
exits 1 with the reason (daemon logs included). ``down`` undoes everything ``up`` recorded in DIR/plan.json
(written before anything is created), in any state of completion: it cancels the jobs, stops the daemons by
their recorded PID and start time (SIGTERM, then SIGKILL), kills every process left in the namespaces
(slurmstepd and job tasks included), deletes namespaces, links and /etc/hosts lines. It is idempotent, tries
every step even when one fails, and keeps DIR/logs for a post-mortem.

Processes are started with ``nsenter --net=/var/run/netns/NAME``, never ``ip netns exec``: the latter also
remounts /sys in a private mount namespace, which hides the cgroup file system that slurmd checks.

Only the Python standard library is used. The Debian packages needed are installed by
scripts/system_packages.sh.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import ipaddress
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

NETNS_DIR = Path("/var/run/netns")
HOSTS_FILE = Path("/etc/hosts")
# One lock for every bed on the machine: held while a subnet is chosen and claimed, and while /etc/hosts is edited.
LOCK_FILE = Path("/run/lock/testbed.lock")

LAN_IF = "lan0"
DECOY_IF = "decoy0"
IFNAMSIZ = 15  # the longest Linux interface name
ID_HEX = 4
MAX_HOSTS = 200  # addresses .11 .. .210 of the /24
PARTITION = "debug"

PREFIX_RE = re.compile(r"[a-z][a-z0-9]*")
# Paths go into slurm.conf and command lines unquoted: keep them plain.
SAFE_PATH_RE = re.compile(r"[A-Za-z0-9._/+-]+")

# Step credential lifetime, and how long a requeued job waits before it may start again (Slurm's default,
# 120 s, makes every requeue test wait two minutes)
CRED_EXPIRE = 10
DAEMON_START_TIMEOUT = 60.0
GRACE = 5.0  # seconds between SIGTERM and SIGKILL
VERBOSE = True


class TestbedError(Exception):
    """A failure whose message is meant for the person running the script."""


# --------------------------------------------------------------------------- small utilities


def say(msg: str) -> None:
    """Progress on stderr (stdout carries only the JSON description)."""
    if VERBOSE:
        print(f"testbed: {msg}", file=sys.stderr, flush=True)


def sh(*argv: str, check: bool = True, timeout: float = 30,
       env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command, capture its output; with ``check`` a failure raises TestbedError showing the command."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise TestbedError(f"timed out after {timeout:.0f} s: {shlex.join(argv)}") from e
    except FileNotFoundError as e:
        raise TestbedError(f"{argv[0]} is not installed (run scripts/system_packages.sh)") from e
    if check and done.returncode != 0:
        why = (done.stderr or done.stdout).strip()
        raise TestbedError(f"`{shlex.join(argv)}` failed (exit {done.returncode}): {why}")
    return done


def wait_for(what: str, ready: Callable[[], bool], timeout: float, detail: Callable[[], str] = lambda: "",
             daemons: Paths | None = None) -> None:
    """Poll ``ready()`` every 0.1 s until it is true; after ``timeout`` seconds raise with ``detail()``.
    With ``daemons``, raise at once when a daemon recorded there has exited.

    Only for daemons coming up, which tell nobody when they are ready.
    """
    deadline = time.monotonic() + timeout
    while not ready():
        dead = dead_daemons(daemons) if daemons else []
        if dead:
            raise TestbedError(f"{what}: {', '.join(dead)} exited\n{detail()}")
        if time.monotonic() > deadline:
            raise TestbedError(f"{what}: not after {timeout:.0f} s\n{detail()}")
        time.sleep(0.1)


@contextlib.contextmanager
def machine_lock() -> Iterator[None]:
    """Exclusive lock shared by all beds on this machine (subnet choice, /etc/hosts edits)."""
    LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK_FILE, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def free_port() -> int:
    """A TCP port free right now on every address of the root namespace (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def tail(path: Path, lines: int = 25) -> str:
    """The last lines of a log file, headed by its path (for error messages)."""
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return f"--- {path}: (none)"
    return f"--- {path}:\n" + "\n".join(text)


# --------------------------------------------------------------------------- the plan: every name, address, port


@dataclass(frozen=True)
class Host:
    """One namespace host. ``name`` is at once the namespace, the host name and the Slurm node name."""

    index: int
    name: str
    addr: str
    veth: str  # the root-namespace end of the veth pair; the namespace end is LAN_IF
    decoy_addr: str | None

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

    def pid_file(self, daemon: str) -> Path:
        return self.pids / f"{daemon}.pid"

    def netns_inode(self, host: str) -> Path:
        return self.pids / f"{host}.netns"

    def log(self, daemon: str) -> Path:
        return self.logs / f"{daemon}.log"

    def runtime(self) -> list[Path]:
        """What `down` removes (logs/ stays for a post-mortem)."""
        return [self.munge, self.slurm, self.pids, self.tmp, self.slurm_conf, self.rsh_agent, self.description]


def check_prefix(prefix: str, n_hosts: int) -> None:
    """Names must be DNS labels and Slurm node names, and the interface names must fit in IFNAMSIZ."""
    if not PREFIX_RE.fullmatch(prefix):
        raise TestbedError(f"--prefix {prefix!r}: use lowercase letters and digits, starting with a letter")
    longest = max(len(f"{prefix}{'0' * ID_HEX}br"), len(f"{prefix}{'0' * ID_HEX}v{n_hosts}"))
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
    tag = f"{args.prefix}{bed_id}"
    hosts = tuple(
        Host(index=i, name=f"{tag}h{i}", addr=str(subnet[10 + i]), veth=f"{tag}v{i}",
             decoy_addr=str(decoy[10 + i]) if decoy else None)
        for i in range(1, args.hosts + 1)
    )
    ctl_port = free_port() if args.slurm else None
    slurmd_port = None
    while args.slurm and slurmd_port in (None, ctl_port):
        slurmd_port = free_port()
    return Plan(id=bed_id, prefix=args.prefix, state=str(state), subnet=str(subnet),
                decoy_subnet=str(decoy) if decoy else None, cpus=args.cpus, slurm=args.slurm,
                ctl_port=ctl_port, slurmd_port=slurmd_port, hosts=hosts)


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


# --------------------------------------------------------------------------- network


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


# --------------------------------------------------------------------------- processes


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (field 22 of /proc/PID/stat), None if it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def alive(pid: int, started: str | None = None) -> bool:
    """Running (not a zombie) and, if ``started`` is given, the same process as recorded (no PID reuse)."""
    now = start_time(pid)
    return now is not None and (started is None or now == started)


def spawn(paths: Paths, daemon: str, argv: Sequence[str]) -> int:
    """Start a foreground daemon detached (own session, output to logs/DAEMON.out); record "PID STARTTIME"."""
    with open(paths.logs / f"{daemon}.out", "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=paths.root)
    paths.pid_file(daemon).write_text(f"{proc.pid} {start_time(proc.pid)}\n")
    return proc.pid


def recorded(paths: Paths) -> dict[str, tuple[int, str]]:
    """Daemon name -> (pid, start time) from the pid files."""
    found = {}
    for f in sorted(paths.pids.glob("*.pid")) if paths.pids.is_dir() else []:
        with contextlib.suppress(ValueError):
            pid, started = f.read_text().split()
            found[f.stem] = (int(pid), started)
    return found


def dead_daemons(paths: Paths) -> list[str]:
    """The recorded daemons that are no longer running."""
    return [name for name, (pid, started) in recorded(paths).items() if not alive(pid, started)]


def terminate(pids: dict[int, str | None], grace: float = GRACE) -> None:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL what is left. ``pids``: pid -> start time or None."""
    def signal_all(sig: int) -> None:
        for pid, started in pids.items():
            if alive(pid, started):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)

    signal_all(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(alive(p, s) for p, s in pids.items()) and time.monotonic() < deadline:
        time.sleep(0.05)
    signal_all(signal.SIGKILL)
    deadline = time.monotonic() + 2
    while any(alive(p, s) for p, s in pids.items()) and time.monotonic() < deadline:
        time.sleep(0.05)


def record_netns(paths: Paths, host: Host) -> None:
    """Remember the namespace's inode: its processes can be found even once its name is gone."""
    paths.netns_inode(host.name).write_text(f"{os.stat(host.netns_path).st_ino}\n")


def namespace_pids(plan: Plan, paths: Paths) -> dict[int, None]:
    """Every process inside one of the bed's namespaces (slurmd, slurmstepd, tasks, orted...), not ourselves:
    ``ip netns pids`` for the namespaces that have their names, and a look through /proc for the recorded
    inodes of those that lost them (``ip netns del`` while a process still held the namespace)."""
    me = {os.getpid(), os.getppid()}
    pids: set[int] = set()
    for h in plan.hosts:
        if Path(h.netns_path).exists():
            pids.update(int(p) for p in sh("ip", "netns", "pids", h.name, check=False).stdout.split() if p.isdigit())
    inodes = set()
    for h in plan.hosts:
        with contextlib.suppress(OSError, ValueError):
            inodes.add(f"net:[{int(paths.netns_inode(h.name).read_text())}]")
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and os.readlink(proc / "ns" / "net") in inodes:
                pids.add(int(proc.name))
    return {pid: None for pid in pids - me}


# --------------------------------------------------------------------------- munge and slurm


def start_munge(paths: Paths) -> None:
    """Our own munged: fresh key (mode 0400), socket, pid, log and seed files under DIR/munge."""
    paths.munge.mkdir(mode=0o755, exist_ok=True)  # munged wants its socket folder searchable by all
    fd = os.open(paths.munge_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    with os.fdopen(fd, "wb") as f:
        f.write(os.urandom(1024))
    spawn(paths, "munged", [
        "munged", "--foreground", "--force",
        f"--socket={paths.munge_socket}", f"--key-file={paths.munge_key}",
        f"--pid-file={paths.munge / 'munged.pid'}", f"--log-file={paths.log('munged')}",
        f"--seed-file={paths.munge / 'munged.seed'}",
    ])
    # in the foreground munged logs to stderr (logs/munged.out), whatever --log-file says
    wait_for("munged socket", paths.munge_socket.exists, 15, lambda: tail(paths.logs / "munged.out"), daemons=paths)


def slurm_conf(plan: Plan, paths: Paths) -> str:
    """slurm.conf for a cluster of the bed's hosts, every file under DIR, tuned for quick tests."""
    s = paths.slurm
    nodes = "\n".join(
        f"NodeName={h.name} NodeAddr={h.addr} CPUs={plan.cpus} RealMemory=1024 State=UNKNOWN" for h in plan.hosts)
    return f"""\
# Slurm cluster of test bed {plan.tag} (scripts/testbed.py); everything it uses lives under {plan.state}
ClusterName=tb{plan.id}
SlurmctldHost={plan.ctl_name}({plan.bridge_addr})
SlurmctldPort={plan.ctl_port}
SlurmdPort={plan.slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={paths.munge_socket},cred_expire={CRED_EXPIRE}
CredType=cred/munge
StateSaveLocation={s}/ctld
SlurmdSpoolDir={s}/spool/%n
SlurmctldPidFile={s}/slurmctld.pid
SlurmdPidFile={s}/slurmd-%n.pid
SlurmctldLogFile={paths.log('slurmctld')}
SlurmdLogFile={paths.logs}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig={paths.plugstack}
MailProg=/bin/true
# namespaces share the machine's cgroups and CPUs: track processes by /proc, bind nothing,
# and let a node claim more CPUs than the machine has
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SlurmdParameters=config_overrides
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
JobRequeue=1
# short timeouts: this is a test bed. bf_interval=1: a requeued job starts about 1 s after cred_expire
# (in AuthInfo) instead of at the next 30 s backfill pass
SchedulerParameters=bf_interval=1
KillWait=5
MinJobAge=5
InactiveLimit=0
MessageTimeout=10
SlurmctldTimeout=30
SlurmdTimeout=30
{nodes}
PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def slurm_env(paths: Paths) -> dict[str, str]:
    """os.environ without inherited Slurm variables, plus SLURM_CONF of this bed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["SLURM_CONF"] = str(paths.slurm_conf)
    return env


def slurm_logs(plan: Plan, paths: Paths) -> str:
    """The ends of the Slurm daemons' logs (their own log file, or their output where there is none yet)."""
    parts = []
    for daemon in ["slurmctld"] + [f"slurmd-{h.name}" for h in plan.hosts]:
        log = paths.log(daemon)
        parts.append(tail(log if log.exists() and log.stat().st_size else paths.logs / f"{daemon}.out", 15))
    return "\n".join(parts)


def node_states(paths: Paths) -> dict[str, str]:
    """Node name -> long state ("idle", "down*", ...) as sinfo reports it; {} while slurmctld does not answer."""
    done = sh("sinfo", "-h", "-N", "-o", "%N %T", check=False, timeout=15, env=slurm_env(paths))
    if done.returncode != 0:
        return {}
    return dict(line.split() for line in done.stdout.splitlines() if line.strip())


def start_slurm(plan: Plan, paths: Paths) -> None:
    """slurmctld in the root namespace, one slurmd per host in its namespace; wait until all nodes are idle."""
    paths.slurm.mkdir(exist_ok=True)
    (paths.slurm / "ctld").mkdir(exist_ok=True)
    for h in plan.hosts:
        (paths.slurm / "spool" / h.name).mkdir(parents=True, exist_ok=True)
    paths.plugstack.write_text("")  # no SPANK plugins (not the machine's /etc/slurm/plugstack.conf)
    paths.slurm_conf.write_text(slurm_conf(plan, paths))
    # slurmctld only runs where the host name is SlurmctldHost's: give it its own UTS namespace named so.
    spawn(paths, "slurmctld", ["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"',
                               plan.ctl_name, "slurmctld", "-D", "-f", str(paths.slurm_conf)])
    for h in plan.hosts:
        spawn(paths, f"slurmd-{h.name}", ["nsenter", f"--net={h.netns_path}", "--",
                                          "slurmd", "-D", "-N", h.name, "-f", str(paths.slurm_conf)])
    want = {h.name for h in plan.hosts}

    def all_idle() -> bool:
        states = node_states(paths)
        return set(states) == want and all(s == "idle" for s in states.values())

    wait_for("all Slurm nodes idle", all_idle, DAEMON_START_TIMEOUT,
             lambda: f"sinfo: {node_states(paths)}\n{slurm_logs(plan, paths)}", daemons=paths)


def cancel_jobs(paths: Paths) -> None:
    """scancel every job of the cluster and give them a few seconds to go (their processes die with the bed
    anyway). Asks nothing of a slurmctld that is not running: the commands would retry for MessageTimeout."""
    ctld = recorded(paths).get("slurmctld")
    if ctld is None or not alive(*ctld):
        return
    env = slurm_env(paths)
    if sh("scancel", "--partition", PARTITION, check=False, timeout=10, env=env).returncode != 0:
        return  # slurmctld is not answering: nothing to ask it

    def no_jobs() -> bool:
        done = sh("squeue", "-h", "-o", "%A", check=False, timeout=10, env=env)
        return done.returncode != 0 or not done.stdout.strip()

    with contextlib.suppress(TestbedError):
        wait_for("jobs cancelled", no_jobs, 5)


# --------------------------------------------------------------------------- open mpi


def rsh_agent_script(plan: Plan) -> str:
    """A /bin/sh stand-in for ssh: ``agent [ssh options] [user@]HOST command...`` runs the command in HOST's
    namespace through ``sh -c`` (as sshd would, with the words joined by spaces), and exits with its status.

    TMPDIR is set to DIR/tmp/HOST: with one /tmp and one host name for all namespaces, the orteds of different
    hosts shared Open MPI's session directory and about 1 run in 8 failed (orted segfault in
    hwloc_shmem_topology_write, or "mkdir ... File exists" in orte_session_dir).
    """
    tmp = Paths(Path(plan.state)).tmp
    cases = "\n".join(f"  {h.name}|{h.addr}) ns={h.netns_path} tmp={tmp / h.name} ;;" for h in plan.hosts)
    return f"""#!/bin/sh
# rsh/ssh agent of test bed {plan.tag} (scripts/testbed.py), for Open MPI's plm_rsh_agent.
while [ $# -gt 0 ]; do
  case "$1" in
    -[BbcDEeFIiJLlmOoPpQRSWw]) shift 2 ;;  # ssh options that take a value
    -*) shift ;;
    *) break ;;
  esac
done
[ $# -ge 2 ] || {{ echo "usage: $0 [ssh options] HOST command..." >&2; exit 255; }}
host=${{1#*@}}
shift
case "$host" in
{cases}
  *) echo "$0: no host $host in test bed {plan.tag}" >&2; exit 255 ;;
esac
# a /tmp of its own per host, as separate machines have: Open MPI's session directory is
# $TMPDIR/ompi.HOSTNAME.UID, and the namespaces share one host name and one /tmp
mkdir -p "$tmp" && export TMPDIR="$tmp"
exec nsenter --net="$ns" -- /bin/sh -c "$*"
"""


def mpirun_args(plan: Plan, paths: Paths) -> list[str]:
    """What ``mpirun``, started in the root namespace, needs to run ranks on the bed's hosts (found by experiment
    with Open MPI 4.1.4 and a small C program doing MPI_Allreduce and MPI_Sendrecv across hosts).

    * ``--allow-run-as-root``: the bed runs as root; ``--oversubscribe``: the hosts share the machine's few cores.
    * ``plm_rsh_agent``: start the daemons (orted) through DIR/rsh-agent instead of ssh. Needed.
    * ``btl_tcp_if_include SUBNET``: needed with decoys. Every host's decoy0 is on the same decoy subnet, so the
      TCP BTL takes it as a route between hosts, and sends into an interface that drops everything: every
      run hung until killed. Without decoys the agent alone was enough.
    * ``oob_tcp_if_include SUBNET``: not needed in the experiments (the orteds reach mpirun through their default
      route), kept so that daemons never offer or try the decoy and root-namespace addresses.
    * ``plm_rsh_no_tree_spawn 1``: tree spawn worked too (4 hosts); this way only mpirun calls the agent.
    * ``pml ob1``, ``btl tcp,self,vader``: no probing of UCX, openib and libfabric (0.33 s instead of 0.51 s a
      run), and no transport that ignores btl_tcp_if_include.
    """
    return ["--allow-run-as-root", "--oversubscribe",
            "--mca", "plm_rsh_agent", str(paths.rsh_agent),
            "--mca", "btl_tcp_if_include", plan.subnet,
            "--mca", "oob_tcp_if_include", plan.subnet,
            "--mca", "plm_rsh_no_tree_spawn", "1",
            "--mca", "pml", "ob1",
            "--mca", "btl", "tcp,self,vader"]


# --------------------------------------------------------------------------- up / down


def describe(plan: Plan, paths: Paths, decoy_kinds: dict[str, str | None]) -> dict:
    """The JSON description of a running bed."""
    env = {"SLURM_CONF": str(paths.slurm_conf)} if plan.slurm else {}
    return {
        "id": plan.id,
        "tag": plan.tag,
        "state": plan.state,
        "bridge": {"name": plan.bridge, "addr": plan.bridge_addr},
        "subnet": plan.subnet,
        "decoy_subnet": plan.decoy_subnet,
        "ctl": {"name": plan.ctl_name, "addr": plan.bridge_addr},
        "hosts": [{"name": h.name, "netns": h.name, "netns_path": h.netns_path, "addr": h.addr, "ifname": LAN_IF,
                   "decoy_ifname": DECOY_IF if h.decoy_addr else None, "decoy_addr": h.decoy_addr,
                   "decoy_kind": decoy_kinds.get(h.name)} for h in plan.hosts],
        "slurm": {"conf": str(paths.slurm_conf), "partition": PARTITION, "nodes": [h.name for h in plan.hosts],
                  "cluster": f"tb{plan.id}", "ctl_host": plan.ctl_name, "ctl_addr": plan.bridge_addr,
                  "ctl_port": plan.ctl_port, "slurmd_port": plan.slurmd_port, "cpus_per_node": plan.cpus,
                  "cred_expire": CRED_EXPIRE,
                  "munge_socket": str(paths.munge_socket)} if plan.slurm else None,
        "env": env,
        "rsh_agent": str(paths.rsh_agent),
        "mpirun_args": mpirun_args(plan, paths),
        "hosts_marker": plan.marker,
        "logs": str(paths.logs),
    }


def build(plan: Plan, paths: Paths) -> dict:
    """Create the bed described by ``plan`` (the bridge exists already) and return its description."""
    decoy_kinds = {}
    for h in plan.hosts:
        decoy_kinds[h.name] = create_host(plan, paths, h)
    decoys = f", decoys ({decoy_kinds[plan.hosts[0].name]}) on {plan.decoy_subnet}" if plan.decoy_subnet else ""
    say(f"{len(plan.hosts)} hosts on {plan.subnet}{decoys}")
    marker = plan.marker
    edit_hosts_file(lambda line: not line.endswith(marker), hosts_lines(plan))
    paths.rsh_agent.write_text(rsh_agent_script(plan))
    paths.rsh_agent.chmod(0o755)
    if plan.slurm:
        start_munge(paths)
        start_slurm(plan, paths)
        say(f"Slurm cluster tb{plan.id} up: controller {plan.ctl_name}:{plan.ctl_port}")
    description = describe(plan, paths, decoy_kinds)
    paths.description.write_text(json.dumps(description, indent=2) + "\n")
    return description


def teardown(plan: Plan, paths: Paths) -> None:
    """Undo everything of ``plan`` that exists: jobs, daemons, namespace processes, network, /etc/hosts, files.

    Every step is tried whatever became of the ones before; their failures are raised together at the end.
    """
    marker = plan.marker
    daemons = recorded(paths)
    steps: list[tuple[str, Callable[[], None]]] = [
        ("cancel jobs", lambda: cancel_jobs(paths) if plan.slurm else None),
        # munged last: the Slurm daemons still authenticate while they shut down
        ("stop daemons", lambda: terminate({pid: t for name, (pid, t) in daemons.items() if name != "munged"})),
        ("stop munged", lambda: terminate({pid: t for name, (pid, t) in daemons.items() if name == "munged"})),
        ("kill namespace processes", lambda: terminate(namespace_pids(plan, paths), grace=2)),
        ("delete network", lambda: delete_network(plan)),
        ("clean /etc/hosts", lambda: edit_hosts_file(lambda line: not line.endswith(marker))),
        ("remove files", lambda: remove_runtime_files(paths)),
    ]
    failed = []
    for what, step in steps:
        try:
            step()
        except (TestbedError, OSError) as e:
            failed.append(f"{what}: {e}")
    if failed:
        raise TestbedError("down left things behind (run it again once fixed):\n  " + "\n  ".join(failed))
    paths.plan.unlink(missing_ok=True)


def remove_runtime_files(paths: Paths) -> None:
    for p in paths.runtime():
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def check_root() -> None:
    if os.geteuid() != 0:
        raise TestbedError("run as root: namespaces, links and /etc/hosts need it")


def state_dir(raw: str) -> Path:
    path = Path(raw).absolute()
    if not SAFE_PATH_RE.fullmatch(str(path)):
        raise TestbedError(f"--state {str(path)!r}: use letters, digits and ._/+- only (the path goes into "
                           f"slurm.conf and command lines)")
    return path


def cmd_up(args: argparse.Namespace) -> int:
    check_root()
    if not 1 <= args.hosts <= MAX_HOSTS:
        raise TestbedError(f"--hosts {args.hosts}: between 1 and {MAX_HOSTS}")
    if args.cpus < 1:
        raise TestbedError(f"--cpus {args.cpus}: at least 1")
    check_prefix(args.prefix, args.hosts)
    paths = Paths(state_dir(args.state))
    if paths.plan.exists():
        raise TestbedError(f"{paths.root} holds a bed already: run `down --state {paths.root}` first")
    paths.root.mkdir(parents=True, exist_ok=True)
    paths.logs.mkdir(exist_ok=True)
    paths.pids.mkdir(exist_ok=True)
    started = time.monotonic()
    with machine_lock():
        plan = make_plan(args, paths.root)
        paths.plan.write_text(json.dumps(plan.to_json(), indent=2) + "\n")
        try:
            create_bridge(plan)  # claims the subnet: the next bed's used_networks() sees it
        except BaseException:
            delete_network(plan)
            paths.plan.unlink(missing_ok=True)
            raise
    try:
        description = build(plan, paths)
    except BaseException as e:
        say(f"up {'interrupted' if isinstance(e, (SystemExit, KeyboardInterrupt)) else 'failed'}: "
            f"tearing down what was made")
        try:
            teardown(plan, paths)
        except TestbedError as cleanup:
            print(f"testbed up: {cleanup}", file=sys.stderr)  # the first failure is the one to raise
        raise
    say(f"bed {plan.tag} up in {time.monotonic() - started:.1f} s (state {paths.root})")
    print(json.dumps(description, indent=2))
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    check_root()
    paths = Paths(state_dir(args.state))
    plan = load_plan(paths)
    if plan is None:
        say(f"nothing to take down in {paths.root}")
        return 0
    started = time.monotonic()
    teardown(plan, paths)
    say(f"bed {plan.tag} down in {time.monotonic() - started:.1f} s")
    return 0


def running_description(paths: Paths) -> dict:
    try:
        return json.loads(paths.description.read_text())
    except FileNotFoundError:
        raise TestbedError(f"no bed is up in {paths.root} (no {paths.description.name})") from None


def cmd_env(args: argparse.Namespace) -> int:
    paths = Paths(state_dir(args.state))
    desc = running_description(paths)
    print(f"# test bed {desc['tag']}: hosts {' '.join(h['name'] for h in desc['hosts'])}")
    if not desc["env"]:
        print("# (no Slurm cluster in this bed)")
    for k, v in desc["env"].items():
        print(f"export {k}={shlex.quote(v)}")
    print(f"export TESTBED_STATE={shlex.quote(desc['state'])}")
    print(f"export TESTBED_MPIRUN_ARGS={shlex.quote(shlex.join(desc['mpirun_args']))}")
    return 0


def cmd_exec(args: argparse.Namespace) -> int:
    paths = Paths(state_dir(args.state))
    plan = load_plan(paths)
    if plan is None:
        raise TestbedError(f"no bed is up in {paths.root}")
    host = find_host(plan, args.host)
    argv = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not argv:
        raise TestbedError("exec: give a command after --")
    os.execvp("nsenter", ["nsenter", f"--net={host.netns_path}", "--", *argv])
    return 127  # not reached


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress messages on stderr")
    sub = p.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="create a bed, print its JSON description")
    up.add_argument("--state", required=True, help="directory for everything of this bed")
    up.add_argument("--hosts", type=int, default=2, help="number of namespace hosts (default 2)")
    up.add_argument("--cpus", type=int, default=8, help="CPUs each Slurm node claims (default 8)")
    up.add_argument("--slurm", action="store_true", help="run a Slurm cluster (munged, slurmctld, slurmd per host)")
    up.add_argument("--decoy", action="store_true", help=f"give each host a {DECOY_IF} that routes nowhere")
    up.add_argument("--prefix", default="tb", help="start of every name (default tb)")
    up.set_defaults(func=cmd_up)

    down = sub.add_parser("down", help="take the bed in --state down (idempotent)")
    down.add_argument("--state", required=True)
    down.set_defaults(func=cmd_down)

    env = sub.add_parser("env", help="print export lines for using the bed from a shell")
    env.add_argument("--state", required=True)
    env.set_defaults(func=cmd_env)

    ex = sub.add_parser("exec", help="run a command in a host's network namespace")
    ex.add_argument("--state", required=True)
    ex.add_argument("host", help="host name, address or h<i>")
    ex.add_argument("cmd", nargs=argparse.REMAINDER, help="-- command...")
    ex.set_defaults(func=cmd_exec)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    global VERBOSE
    args = parse_args(sys.argv[1:] if argv is None else argv)
    VERBOSE = not args.quiet
    # SIGTERM/SIGHUP during `up` must still tear down: turn them into an exception
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: sys.exit(128 + signum))
    try:
        return args.func(args)
    except TestbedError as e:
        print(f"testbed {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"testbed {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
