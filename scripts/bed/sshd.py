"""A real sshd in every host (Debian's openssh-server), for launcher=ssh: keys made here, one daemon per host
started inside the host's network namespace and stopped by its recorded pid, like the Slurm daemons.

What ``up --sshd`` makes, all under DIR/ssh:

* ``client_key`` (ed25519, no passphrase): the one key the tests log in with, as root;
* per host ``<name>/``: its host key, its ``sshd_config`` (listening on the host's address, port 22 of its own
  namespace; public keys only; every file it reads under DIR) and its ``authorized_keys`` (the client key).
  A test makes a host refuse logins by emptying that file (sshd reads it at each login);
* ``known_hosts`` (every host's key under its name and address) and ``ssh_config``: ``ssh -F DIR/ssh/ssh_config
  HOST`` logs in as root with the client key and checks the host key strictly;
* a private mount namespace per host (``unshare --mount``, started from its network namespace), in which
  ``<name>/home`` is bind-mounted over DIR/home: the same path is a different folder on every host, and the root
  namespace's DIR/home is none of theirs, as on separate machines. Everything the host's sshd starts (the logins,
  the processes they start) sees that namespace; ``/proc/<sshd pid>/ns/mnt`` (in the description) enters it, to
  change what one host sees (hide a folder) for one test. The login user's ``~/.bashrc`` is an empty file there: bash
  reads it for every command sshd runs (Debian builds it so), and this machine's (a pyenv init: some 200 processes
  a login) is no part of a fresh host; the runner names every program by its path, so nothing needs it.
"""

from __future__ import annotations

import os
import pwd
import socket
from pathlib import Path

from bed.common import sh, tail
from bed.layout import Host, Paths, Plan
from bed.processes import recorded, spawn, wait_for

SSHD = "/usr/sbin/sshd"  # sshd re-executes itself, so it must be started by its absolute path
PRIVSEP_DIR = Path("/run/sshd")  # sshd refuses to start without it (Debian's package makes it at boot)
SSH_PORT = 22  # in each host's own network namespace: nothing else listens there
START_TIMEOUT = 30.0


def daemon_name(host: Host) -> str:
    return f"sshd-{host.name}"


def host_dir(paths: Paths, host: Host) -> Path:
    return paths.ssh / host.name


def sshd_config(plan: Plan, paths: Paths, host: Host) -> str:
    folder = host_dir(paths, host)
    return f"""\
# sshd of host {host.name} of test bed {plan.tag} (scripts/testbed.py): every file it reads is under {folder}
ListenAddress {host.addr}
Port {SSH_PORT}
HostKey {folder}/host_key
AuthorizedKeysFile {folder}/authorized_keys
PidFile none
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
# the bed's files live in a temporary folder of the tests: do not insist on a home's permissions
StrictModes no
UseDNS no
PrintMotd no
PrintLastLog no
X11Forwarding no
# the tests start several logins at once (checks, then one session per host, for several jobs)
MaxStartups 200
MaxSessions 200
LogLevel VERBOSE
# the hosts share this machine's cores: a thread a process, as the tests' own shell says (tests/runs.py, SHARED_CORES)
SetEnv OMP_NUM_THREADS=1
"""


def ssh_config(plan: Plan, paths: Paths) -> str:
    names = " ".join(f"{h.name} {h.addr}" for h in plan.hosts)
    return f"""\
# ssh to the hosts of test bed {plan.tag} (scripts/testbed.py): ssh -F {paths.ssh_config} HOST
Host {names}
  User root
  Port {SSH_PORT}
  IdentityFile {paths.ssh / 'client_key'}
  IdentitiesOnly yes
  UserKnownHostsFile {paths.ssh / 'known_hosts'}
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
"""


def _keygen(path: Path, comment: str) -> str:
    """A fresh ed25519 key pair at ``path`` (no passphrase); its public key line."""
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path))
    return path.with_name(path.name + ".pub").read_text().strip()


def listening(addr: str) -> bool:
    try:
        socket.create_connection((addr, SSH_PORT), timeout=1).close()
        return True
    except OSError:
        return False


def start_sshd(plan: Plan, paths: Paths) -> None:
    """Keys, configurations and one sshd per host in its namespaces; wait until each listens."""
    paths.ssh.mkdir(mode=0o700, exist_ok=True)
    paths.home.mkdir(exist_ok=True)
    PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    client = _keygen(paths.ssh / "client_key", f"testbed-{plan.tag}")
    known = []
    bashrc = Path(pwd.getpwuid(os.getuid()).pw_dir) / ".bashrc"  # the logins' user is this one
    empty = paths.ssh / "empty_bashrc"
    empty.write_text("")
    # each host's own mount namespace (private: nothing mounted there shows elsewhere), with its home over DIR/home
    # and an empty ~/.bashrc (where there is one)
    mounts = 'mount --bind "$1" "$2" && { [ ! -f "$5" ] || mount --bind "$6" "$5"; }'
    for h in plan.hosts:
        folder = host_dir(paths, h)
        (folder / "home").mkdir(parents=True, exist_ok=True)
        key = _keygen(folder / "host_key", h.name)
        known.append(f"{h.name},{h.addr} {' '.join(key.split()[:2])}")
        (folder / "authorized_keys").write_text(client + "\n")
        (folder / "sshd_config").write_text(sshd_config(plan, paths, h))
        spawn(paths, daemon_name(h), [
            "nsenter", f"--net={h.netns_path}", "--", "unshare", "--mount", "--propagation", "private", "--",
            "/bin/sh", "-c", f'{mounts} && exec "$3" -D -e -f "$4"', "sshd",
            str(folder / "home"), str(paths.home), SSHD, str(folder / "sshd_config"), str(bashrc), str(empty)])
    paths.known_hosts.write_text("\n".join(known) + "\n")
    paths.ssh_config.write_text(ssh_config(plan, paths))
    for h in plan.hosts:
        wait_for(f"sshd of {h.name} listening on {h.addr}:{SSH_PORT}", lambda h=h: listening(h.addr), START_TIMEOUT,
                 lambda h=h: tail(paths.logs / f"{daemon_name(h)}.out"), daemons=paths)


def describe_sshd(plan: Plan, paths: Paths) -> dict:
    """The ssh part of the bed's description: what a test points ssh at, and each host's own folders."""
    pids = recorded(paths)
    return {
        "config": str(paths.ssh_config),
        "client_key": str(paths.ssh / "client_key"),
        "known_hosts": str(paths.known_hosts),
        "port": SSH_PORT,
        "home": str(paths.home),
        "hosts": {h.name: {"home": str(host_dir(paths, h) / "home"),
                           "authorized_keys": str(host_dir(paths, h) / "authorized_keys"),
                           "sshd_pid": pids[daemon_name(h)][0],
                           "mount_ns": f"/proc/{pids[daemon_name(h)][0]}/ns/mnt",
                           "log": str(paths.logs / f"{daemon_name(h)}.out")} for h in plan.hosts},
    }
