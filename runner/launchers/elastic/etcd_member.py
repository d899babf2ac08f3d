"""The job's own etcd (runner.launchers.elastic.etcd): one member on each machine of a launcher=manual job that
outlives its hosts, started by that machine's `run` and stopped with it, where the user names no etcd of theirs
(``launcher.manual.etcd``).

The members are the spec's hosts and spares, in that order, named by their labels, bootstrapped statically (each
knows the others from the spec: ``--initial-cluster``), on two ports every host derives from the run id (clients,
peers), with a data folder of this launch's own (a temporary one, removed at the end: a relaunch starts a fresh
cluster). etcd decides while a majority of its members is up: ``floor`` members of ``size``. The member dies with
its `run` (PR_SET_PDEATHSIG), whatever ends it.

A machine whose `run` is started again while the others run on (a lost host that comes back: its member's data went
with the `run` that held it) cannot start its member as at the bootstrap: a member that comes back without its data
is one etcd's leader would send entries past its empty log (raft's "tocommit out of range" panic), so etcd's own
procedure is followed (:func:`member_start`): the old member removed from the cluster, a new one added with the same
name and address, and started to join the cluster as it is (``--initial-cluster-state existing``), from a snapshot
of the others.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.common.owned_folders import OwnedFolder, remove_abandoned
from runner.launchers.elastic.etcd import Etcd, EtcdError
from runner.plan.processes import RunPort, port_for
from runner.spec.job import Job
from runner.worker.rank_process import die_with_parent

ETCD = "etcd"  # the server's program (Debian's etcd-server)
READY_S = 0.2  # how often a starting member is asked whether it serves


@dataclass(frozen=True)
class OwnCluster:
    """The members of a job's own etcd: their names (the machines' labels) and addresses, and the two ports."""

    names: tuple[str, ...]
    addrs: tuple[str, ...]
    client_port: int
    peer_port: int
    token: str  # the cluster's token (the run id): members of another run's cluster never join this one

    @classmethod
    def of(cls, job: Job) -> OwnCluster:
        machines = (*job.hosts, *job.spares)
        run_id = job.spec.run_id or ""
        return cls(names=tuple(h.label for h in machines), addrs=tuple(str(h.reach or h.label) for h in machines),
                   client_port=port_for(run_id, RunPort.ETCD_CLIENTS),
                   peer_port=port_for(run_id, RunPort.ETCD_PEERS), token=run_id)

    @property
    def size(self) -> int:
        return len(self.names)

    @property
    def floor(self) -> int:
        """The members that must be up for etcd to decide: a majority."""
        return self.size // 2 + 1

    @property
    def endpoints(self) -> list[str]:
        return [f"{_url_host(a)}:{self.client_port}" for a in self.addrs]

    def endpoints_from(self, index: int) -> list[str]:
        """The endpoints as member ``index``'s machine asks them: its own member first (on this machine: never
        across a link that is down, never a frozen peer's to wait out first), then the others in order."""
        every = self.endpoints
        return [every[index], *every[:index], *every[index + 1:]]

    def peer_url(self, index: int) -> str:
        return f"http://{_url_host(_ip(self.addrs[index]))}:{self.peer_port}"

    def argv(self, index: int, data_dir: Path, state: str = "new") -> list[str]:
        """The command of member ``index`` (etcd binds IP addresses only: names are resolved here); ``state``: ``new``
        at the bootstrap, ``existing`` for a member added to the running cluster (:func:`member_start`)."""
        addr = _url_host(_ip(self.addrs[index]))
        cluster = ",".join(f"{n}=http://{_url_host(_ip(a))}:{self.peer_port}" for n, a in zip(self.names, self.addrs))
        return [ETCD, "--name", self.names[index], "--data-dir", str(data_dir), "--logger", "zap",
                "--listen-client-urls", f"http://{addr}:{self.client_port}",
                "--advertise-client-urls", f"http://{addr}:{self.client_port}",
                "--listen-peer-urls", f"http://{addr}:{self.peer_port}",
                "--initial-advertise-peer-urls", f"http://{addr}:{self.peer_port}",
                "--initial-cluster", cluster, "--initial-cluster-state", state, "--initial-cluster-token", self.token,
                "--pre-vote"]  # a member cut off and back does not call an election (etcd 3.5's default): the
        # others' leader stays, and no host loses etcd for an election's time because one flapped


def _url_host(addr: str) -> str:
    return f"[{addr}]" if ":" in addr else addr


def _ip(addr: str) -> str:
    """``addr``'s IP address (itself, for an address), as this machine resolves it."""
    try:
        return str(socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)[0][4][0])
    except OSError:
        return addr  # (etcd says it cannot bind a name; the spec check named unresolvable hosts already)


class MemberRefused(Exception):
    """This machine's member cannot join the job's etcd again (the message says why)."""


def member_start(cluster: OwnCluster, index: int, within_s: float) -> str:
    """How member ``index`` starts: ``new`` (the bootstrap: the cluster is not up, or it is and this member of the
    bootstrap never started), or ``existing`` once its earlier self (started, then gone with its machine's `run`)
    was removed from the cluster and a member of its name and address added, which is etcd's way for a member that
    lost its data. Asks the other members; retries the changes (etcd refuses one until its members have been
    connected a while) for ``within_s``. Raises MemberRefused where this member still runs here, or the changes are
    not taken in time."""
    others = [e for i, e in enumerate(cluster.endpoints) if i != index]
    if not others:
        return "new"
    url = cluster.peer_url(index)
    etcd = Etcd(others, ask_s=1.0)

    def listed() -> dict[str, Any] | None:
        """This member as the others list it (None: not listed)."""
        return next((m for m in etcd.members() if url in m.get("peerURLs", ())), None)

    try:
        mine = listed()
    except EtcdError:
        return "new"  # (no member up to ask: the bootstrap)
    if mine is not None and not mine.get("clientURLs"):  # never started (a member says its client URLs once it runs)
        # listed from the bootstrap (named there): it starts as the others did; else added by an earlier try
        return "new" if mine.get("name") else "existing"
    if _serving(cluster.addrs[index], cluster.client_port):
        raise MemberRefused(f"this host's member of the job's etcd still runs here (port {cluster.client_port}): "
                            f"another `run` of this host holds it")
    etcd.ask_s = 5.0  # (a change is committed by a majority: slower than a read)
    deadline = time.monotonic() + within_s
    while True:  # each pass reads where the changes stand: one whose answer was lost is not made twice
        try:
            mine = listed()
            if mine is not None and not mine.get("clientURLs") and not mine.get("name"):
                return "existing"  # added, not started yet
            if mine is not None:
                etcd.remove_member(str(mine["ID"]))
            else:
                etcd.add_member(url)
        except EtcdError as e:
            if time.monotonic() > deadline:
                raise MemberRefused(f"the job's etcd did not take this host's member back within {within_s:g} s "
                                    f"(init.timeout_s): {e}") from None
            time.sleep(READY_S)


def _serving(addr: str, port: int) -> bool:
    try:
        with socket.create_connection((_ip(addr), port), timeout=1.0):
            return True
    except OSError:
        return False


class OwnMember:
    """This machine's member of the job's own etcd, from :meth:`start` to :meth:`stop`; ``state``: how it starts
    (:func:`member_start`)."""

    def __init__(self, cluster: OwnCluster, index: int, log: Path, state: str = "new") -> None:
        self.cluster, self.index = cluster, index
        remove_abandoned()  # the data of members whose `run` was killed outright on this machine (they could not)
        self._data = OwnedFolder.make_unique(f"etcd-{cluster.names[index]}")
        self.data_dir = self._data.path
        self.log = log
        with open(log, "ab") as out:
            self.process = subprocess.Popen(cluster.argv(index, self.data_dir, state), stdin=subprocess.DEVNULL,
                                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                            preexec_fn=lambda: die_with_parent(signal.SIGKILL))

    def serving(self, timeout_s: float) -> str | None:
        """Wait until this member answers (it serves once a majority of the members is up: the others are started
        by hand, when they are); None, or why not."""
        deadline = time.monotonic() + timeout_s
        own = Etcd([self.cluster.endpoints[self.index]], ask_s=1.0)
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return f"etcd exited {self.process.returncode} (its output: {self.log})"
            try:
                own.get("/runner/ready")
                return None
            except EtcdError:
                time.sleep(READY_S)
        return f"no majority of the job's etcd members ({self.cluster.floor} of {self.cluster.size}) came up within " \
               f"{timeout_s:g} s (init.timeout_s)"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._data.remove()
