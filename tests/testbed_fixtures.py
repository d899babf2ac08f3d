"""Pytest fixtures for the network-namespace test bed of scripts/testbed.py (loaded from conftest.py).

* ``testbed`` (session): two namespace hosts with decoy interfaces, a real Slurm cluster and an sshd in each host
  (each in a mount namespace of its own: ``Bed.ssh``), brought up once
  with ``testbed.py up`` in a pytest temp directory and taken down with ``testbed.py down`` at the end of the
  session, which then fails if a namespace, a process or an /etc/hosts line of the bed is left behind.
  It is a :class:`Bed`: its hosts (:class:`BedHost`: name, address, namespace, interfaces), the Slurm
  partition and environment, the rsh agent and the mpirun arguments, plus ``env()`` and ``exec_argv(host, argv)``.
* :func:`bed_up`, :func:`bed_down`, :func:`leftovers` for tests that make beds of their own.

The bed needs root and the Debian packages of scripts/system_packages.sh; without them it is skipped, or
fails where RUNNER_TESTBED=required (scripts/test.sh, hence CI).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from runs import user_env

TESTBED = Path(__file__).resolve().parents[1] / "scripts" / "testbed.py"
NETNS_DIR = Path("/var/run/netns")
HOSTS_FILE = Path("/etc/hosts")

NETWORK_TOOLS = ("ip", "nsenter", "unshare")
SLURM_TOOLS = ("munged", "slurmctld", "slurmd", "sinfo", "srun", "sbatch", "scancel")
SSH_TOOLS = ("sshd", "ssh", "ssh-keygen")


@dataclass(frozen=True)
class BedHost:
    """One namespace host of a bed: its name is also its namespace and its Slurm node name."""

    name: str
    addr: str  # on ``ifname``, the bridge subnet
    netns_path: str  # /var/run/netns/NAME
    ifname: str
    decoy_ifname: str | None
    decoy_addr: str | None
    data_ifname: str | None = None  # the data network's interface (``up --data-network``), None without one
    data_addr: str | None = None  # on ``data_ifname``, the data subnet


@dataclass(frozen=True)
class Bed:
    """A running test bed, as its JSON description says (``description`` keeps all of it)."""

    state: Path
    hosts: tuple[BedHost, ...]
    subnet: str
    bridge_addr: str
    partition: str | None  # the Slurm partition, None without Slurm
    slurm_env: Mapping[str, str]  # {"SLURM_CONF": ...}, {} without Slurm
    rsh_agent: str
    mpirun_args: tuple[str, ...]
    description: Mapping[str, object]
    ssh: Mapping[str, object] | None = None  # the sshds (scripts/bed/sshd.py): config, home, each host's folders
    data_subnet: str | None = None  # the data network's (``up --data-network``), None without one

    @property
    def ssh_config(self) -> str:
        """``ssh -F <this> HOST`` logs in to a host as root with the bed's key."""
        assert self.ssh is not None, "this bed has no sshd"
        return str(self.ssh["config"])

    def ssh_config_refused_by(self, host: str, folder: Path) -> str:
        """An ssh_config written under ``folder``: :attr:`ssh_config`, but with a fresh key for ``host``, which it
        does not know, so that ``host`` refuses the login and the others accept it. (Emptying ``host``'s
        authorized_keys would refuse the login of every test on the shared bed meanwhile.)"""
        lines = Path(self.ssh_config).read_text().splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("Host "))
        refusing = {host, self.addrs[host]}
        others = [name for name in lines[at].split()[1:] if name not in refusing]
        settings = lines[at + 1:]
        stranger = folder / "stranger_key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "stranger", "-f", str(stranger)],
                       check=True)
        theirs = [f"  IdentityFile {stranger}" if s.strip().startswith("IdentityFile ") else s for s in settings]
        config = folder / "ssh_config"
        config.write_text("\n".join([*lines[:at], f"Host {' '.join(sorted(refusing))}", *theirs,
                                      f"Host {' '.join(others)}", *settings]) + "\n")
        return str(config)

    def home_of(self, host: str | None) -> Path:
        """The folder that is the bed's common home path (``ssh["home"]``) on ``host``; None: in the root namespace."""
        assert self.ssh is not None, "this bed has no sshd"
        return Path(self.ssh["hosts"][host]["home"] if host is not None else self.ssh["home"])

    def mount_ns(self, host: str) -> str:
        """``host``'s mount namespace (its sshd's), for ``nsenter --mount=...``."""
        assert self.ssh is not None, "this bed has no sshd"
        return str(self.ssh["hosts"][host]["mount_ns"])

    @classmethod
    def from_description(cls, d: Mapping) -> Bed:
        """The bed ``d`` (testbed.json) describes; a description from before the data network has none."""
        hosts = tuple(BedHost(name=h["name"], addr=h["addr"], netns_path=h["netns_path"], ifname=h["ifname"],
                              decoy_ifname=h["decoy_ifname"], decoy_addr=h["decoy_addr"],
                              data_ifname=h.get("data_ifname"), data_addr=h.get("data_addr")) for h in d["hosts"])
        return cls(state=Path(d["state"]), hosts=hosts, subnet=d["subnet"], bridge_addr=d["bridge"]["addr"],
                   partition=d["slurm"]["partition"] if d["slurm"] else None, slurm_env=dict(d["env"]),
                   rsh_agent=d["rsh_agent"], mpirun_args=tuple(d["mpirun_args"]), description=d, ssh=d.get("ssh"),
                   data_subnet=d.get("data_subnet"))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(h.name for h in self.hosts)

    @property
    def addrs(self) -> dict[str, str]:
        """Host name -> lan address."""
        return {h.name: h.addr for h in self.hosts}

    @property
    def data_addrs(self) -> dict[str, str]:
        """Host name -> data address, for the hosts that have one (``up --data-network``)."""
        return {h.name: h.data_addr for h in self.hosts if h.data_addr is not None}

    def host(self, name: str) -> BedHost:
        return next(h for h in self.hosts if h.name == name)

    def env(self, **extra: str) -> dict[str, str]:
        """A user's shell on the bed (runs.user_env: no other job's Slurm/MPI variables) with its SLURM_CONF, and
        ``extra``."""
        return user_env({**self.slurm_env, **extra})

    def exec_argv(self, host: str | BedHost, argv: Sequence[str]) -> list[str]:
        """The command line that runs ``argv`` inside ``host``'s network namespace."""
        h = host if isinstance(host, BedHost) else self.host(host)
        return ["nsenter", f"--net={h.netns_path}", "--", *argv]


def unavailable(reason: str) -> None:
    """A test bed cannot be made here: skip, except where the test bed is required (scripts/test.sh sets
    RUNNER_TESTBED=required after installing its packages; CI runs that), where it is a failure."""
    if os.environ.get("RUNNER_TESTBED") == "required":
        pytest.fail(f"{reason} (RUNNER_TESTBED=required)", pytrace=False)
    pytest.skip(reason)


def missing_requirements(slurm: bool, sshd: bool = False) -> str | None:
    """Why a bed cannot be made here (not root, tools missing), or None."""
    if sys.platform != "linux" or os.geteuid() != 0:
        return "the namespace test bed needs root on Linux"
    tools = NETWORK_TOOLS + (SLURM_TOOLS if slurm else ()) + (SSH_TOOLS if sshd else ())
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        return f"the namespace test bed needs {', '.join(missing)}: run scripts/system_packages.sh as root"
    return None


def bed_cmd(*args: str) -> list[str]:
    return [sys.executable, str(TESTBED), "-q", *args]


def bed_up(state: Path, *options: str, timeout: float = 120) -> dict:
    """``testbed.py up --state STATE OPTIONS...``; its JSON description, or a test failure with its stderr."""
    done = subprocess.run(bed_cmd("up", "--state", str(state), *options),
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        pytest.fail(f"testbed.py up {' '.join(options)} failed (exit {done.returncode}):\n{done.stderr}",
                    pytrace=False)
    return json.loads(done.stdout)


def bed_down(state: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(bed_cmd("down", "--state", str(state)), capture_output=True, text=True, timeout=timeout)


def namespace_inodes(description: Mapping) -> dict[int, str]:
    """Inode of each of the bed's network namespaces -> host name (a process in it links to net:[INODE])."""
    return {os.stat(h["netns_path"]).st_ino: h["name"] for h in description["hosts"]}


def _processes() -> dict[int, tuple[str, str]]:
    """pid -> (network namespace link, command line) of every live process (zombies have neither)."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            net = os.readlink(proc / "ns" / "net")
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        found[int(proc.name)] = (net, cmdline)
    return found


def root_links(description: Mapping) -> list[str]:
    """The interfaces a bed made in the root namespace: its bridges and the root ends of its veth pairs."""
    bridges = [description["bridge"], description.get("data_bridge")]
    veths = [h.get(key) for h in description["hosts"] for key in ("veth", "data_veth")]
    return [name for name in [b["name"] for b in bridges if b] + veths if name]


def leftovers(description: Mapping, inodes: Mapping[int, str]) -> list[str]:
    """What of a bed still exists after `down`: namespaces, processes in them or naming its state directory,
    interfaces in the root namespace, /etc/hosts lines with its marker. Empty: nothing."""
    found = [f"namespace {h['name']}" for h in description["hosts"] if (NETNS_DIR / h["name"]).exists()]
    found += [f"interface {name}" for name in root_links(description) if (Path("/sys/class/net") / name).exists()]
    nets = {f"net:[{ino}]": name for ino, name in inodes.items()}
    state = str(description["state"])
    for pid, (net, cmdline) in _processes().items():
        if net in nets or state in cmdline:
            found.append(f"process {pid} ({cmdline.strip()[:100]}) in {nets.get(net, 'the root namespace')}")
    marker = description["hosts_marker"]
    found += [f"/etc/hosts: {line}" for line in HOSTS_FILE.read_text().splitlines() if line.endswith(marker)]
    return found


BED_OPTIONS = ("--hosts", "2", "--slurm", "--sshd", "--decoy")


def _bed_down_and_check(state: Path, description: Mapping, inodes: Mapping[int, str]) -> str | None:
    """Take the bed down; what it left behind (None: nothing)."""
    done = bed_down(state)
    left = leftovers(description, inodes)
    if done.returncode != 0 or left:
        return f"testbed.py down (exit {done.returncode}) left: {left}\n{done.stderr}"
    return None


@pytest.fixture(scope="session")
def testbed(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest):
    """Two namespace hosts (decoy interfaces, Slurm cluster, an sshd each) for the whole session; torn down and
    checked after. Under pytest-xdist the workers share one bed: the first worker that needs it brings it up in
    the folder the controller named (:func:`pytest_configure_node`), the others use it, and the controller takes it
    down at the end of the session (:func:`pytest_sessionfinish`)."""
    reason = missing_requirements(slurm=True, sshd=True)
    if reason:
        unavailable(reason)
    shared = getattr(request.config, "workerinput", {}).get(SHARED_BED)
    if shared is not None:
        yield Bed.from_description(_shared_bed(Path(shared)))
        return
    state = tmp_path_factory.mktemp("testbed")
    description = bed_up(state, *BED_OPTIONS)
    inodes = namespace_inodes(description)
    try:
        yield Bed.from_description(description)
    finally:
        left = _bed_down_and_check(state, description, inodes)
        if left:
            pytest.fail(left, pytrace=False)


# --------------------------------------------------------------------------- one bed for all of xdist's workers

SHARED_BED = "runner_shared_bed"  # the key of the shared bed's folder in each worker's workerinput


def _shared_bed(folder: Path) -> dict:
    """The description of the bed in ``folder``, brought up by whichever worker asks first (under a lock)."""
    state = folder / "bed"
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            described = folder / "description.json"
            if described.exists():
                return json.loads(described.read_text())
            state.mkdir(exist_ok=True)
            description = bed_up(state, *BED_OPTIONS)
            described.write_text(json.dumps({**description, "inodes": namespace_inodes(description)}))
            return description
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def pytest_configure(config: pytest.Config) -> None:
    if getattr(config, "workerinput", None) is None and config.pluginmanager.hasplugin("xdist"):
        config.stash[_SHARED_KEY] = Path(tempfile.mkdtemp(prefix="runner-shared-bed-"))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:  # pytest-xdist's hook, on the controller: what each worker gets
    node.workerinput[SHARED_BED] = str(node.config.stash[_SHARED_KEY])


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The controller takes the workers' shared bed down, if one was brought up, and fails the session if the bed
    left anything behind."""
    folder = session.config.stash.get(_SHARED_KEY, None)
    if folder is None:
        return
    described = folder / "description.json"
    if described.exists():
        description = json.loads(described.read_text())
        inodes = {int(k): v for k, v in description.pop("inodes").items()}
        left = _bed_down_and_check(folder / "bed", description, inodes)
        if left:
            session.config.get_terminal_writer().line(f"\nthe shared test bed: {left}", red=True)
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
            return
    shutil.rmtree(folder, ignore_errors=True)


_SHARED_KEY = pytest.StashKey[Path]()


@contextmanager
def bed_of_its_own(state: Path, *options: str, slurm: bool = False, sshd: bool = False) -> Iterator[Bed]:
    """A bed a test module makes for itself (``testbed.py up --state STATE OPTIONS...``), for the faults it injects
    where the shared bed carries other tests: yielded, then every host's links (lan, and data where it has one)
    brought up again (one a test took down and could not), taken down, and checked to leave nothing behind."""
    reason = missing_requirements(slurm=slurm, sshd=sshd)
    if reason:
        unavailable(reason)
    description = bed_up(state, *options)
    inodes = namespace_inodes(description)
    try:
        yield Bed.from_description(description)
    finally:
        for h in description["hosts"]:
            for ifname in (h["ifname"], h.get("data_ifname")):
                if ifname:
                    subprocess.run(["nsenter", f"--net={h['netns_path']}", "--", "ip", "link", "set", ifname, "up"],
                                   capture_output=True)
        done = bed_down(state)
        left = leftovers(description, inodes)
        assert done.returncode == 0 and not left, (left, done.stderr)
