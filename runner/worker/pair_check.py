"""Before each attempt of a job on several hosts, every pair of hosts checks the data network its backend will use:
each host listens on the address of the interface gloo and NCCL are given (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME;
else the address of its route to the master), on a port the kernel picks from the ephemeral range the backend's own
connections use, says where in the job's channel, and dials every other host there with 256 KiB (full-size
segments: where a path passes a handshake but drops large frames, a switch port's MTU set wrong, the dial fails as a
collective would), waiting up to backend.pair_check_s for its answer. A connection each way: seconds, not a collective's timeout.

The liveness watch cannot see such faults: a host whose data interface is down while its `run` answers on another,
two hosts that cannot reach each other while both reach host 0. Without the check, each attempt waits in its first
collective until init.timeout_s, and the same hosts are sent again until launcher.max_restarts is used up.

One rule names the host, applied once, by host 0's agent (the agent that serves the store every host reads; no
protocol of our own decides anything beyond it): a pair fails when either of its two dials failed; the host in the
most failed pairs is named, ties going to the higher node rank (two hosts that cannot reach each other: host 1 of the
two, never host 0 for a tie); where every pair answered, host 0 names instead a host whose ranks hung the two
attempts before (runner.worker.hung_hosts). One host per attempt: the next attempt's check names the next, if any.
The named host leaves the job as a preempted host does (runner.worker.agent_reports.Leaving; under launcher=manual
its word in the job's etcd): a job that outlives its hosts (topology.min_nodes) goes on without it, a spare in its
place where one is kept, and takes it back only through a check of the same kind (the attempt it joins begins with
one). A job that does not outlive its hosts ends, naming it.

Keys of the job's channel (runner.worker.channel), each under ``pairs/<attempt>/``: ``at/<node>`` (where the host
listens), ``heard/<node>`` (what its dials found), ``verdict`` (host 0's), ``read/<node>`` (the host read it; host 0
keeps the store until every host did, or a few seconds).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import psutil

from runner.common.polling import Clock, Sleep, poll
from runner.worker.network import interface_of, resolve, route_source

HELLO = b"runner-pair "  # what a dial says first: then the job's token and the dialling host's node rank
PAYLOAD = 1 << 18  # the bytes each dial sends (256 KiB: full-size segments, as a collective's buckets send)
LOOK_S = 0.1  # how often the channel is asked for what the other hosts said
SAID_WITHIN_S = 30.0  # how long host 0 waits, beyond a dial's time, for every host to say what its dials found
READ_WAIT_S = 10.0  # how long host 0 keeps its store for the others to read a verdict that ends the attempt


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """What the check found: ``failed`` maps each failed pair (lower node, higher node) to what its dials said;
    ``named`` is the host the rule names (None: every pair answered); ``hung``: where every pair answered, why
    host 0 names a host that hung the job in the two attempts before (runner.worker.hung_hosts) instead."""

    failed: Mapping[tuple[int, int], str]
    named: int | None
    hung: str = ""

    def document(self) -> dict:
        return {"named": self.named, "failed": [[a, b, why] for (a, b), why in sorted(self.failed.items())],
                "hung": self.hung}

    @classmethod
    def of(cls, document: object) -> Verdict | None:
        if not isinstance(document, dict) or "named" not in document:
            return None
        try:
            failed = {(int(a), int(b)): str(why) for a, b, why in document.get("failed", [])}
            named = document["named"]
            return cls(failed=failed, named=None if named is None else int(named), hung=str(document.get("hung", "")))
        except (TypeError, ValueError):
            return None

    def why(self, labels: Sequence[str], attempt: int) -> str:
        """The named host, and each pair that failed: the line every host says."""
        def host(i: int) -> str:
            return f"host {i} ({labels[i]})" if 0 <= i < len(labels) else f"host {i}"

        assert self.named is not None
        if self.hung:
            return f"{host(self.named)} {self.hung}"
        pairs = "; ".join(f"{host(a)} and {host(b)}: {why}" for (a, b), why in sorted(self.failed.items()))
        counted = sum(self.named in pair for pair in self.failed)
        return (f"{host(self.named)} failed the data-network check before attempt {attempt + 1} ({counted} of the "
                f"failed pair(s): {pairs})")


@dataclass(frozen=True)
class Absent:
    """Hosts that never said where they listen within the wait (init.timeout_s): they did not come. The ranks'
    rendezvous would wait as long again for them, in vain."""

    nodes: tuple[int, ...]


def verdict(hosts: int, heard: Mapping[int, Mapping[int, str]]) -> Verdict:
    """The rule of the module docstring, over what each host's dials found (``heard[i][j]``: host i's dial of host j;
    "" where it was answered). A host that said nothing counts for nothing: its dials are unknown, not failed."""
    failed: dict[tuple[int, int], list[str]] = {}
    for i, dials in sorted(heard.items()):  # (in node order: every verdict of the same dials reads the same)
        for j, why in sorted(dials.items()):
            if why and i != j and 0 <= i < hosts and 0 <= j < hosts:
                failed.setdefault((min(i, j), max(i, j)), []).append(f"{i} -> {j}: {why}")
    if not failed:
        return Verdict(failed={}, named=None)
    counts = {h: sum(h in pair for pair in failed) for h in range(hosts)}
    named = max(range(hosts), key=lambda h: (counts[h], h))
    return Verdict(failed={pair: ", ".join(whys) for pair, whys in failed.items()}, named=named)


def data_address(env: Mapping[str, str], master_addr: str) -> str:
    """This host's address on the data network: the first IPv4 address of the interface its backend is given
    (GLOO_SOCKET_IFNAME or NCCL_SOCKET_IFNAME: the first name of a list; a prefix such as NCCL's ``^docker`` cannot
    say which, so the route decides), else its address on the route to the master. Raises NetworkError."""
    for variable in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        named = (env.get(variable) or "").split(",")[0].strip()
        if named and named[0] not in "^=":
            for nic in psutil.net_if_addrs().get(named, []):
                if nic.family == socket.AF_INET:
                    return nic.address
    ip = resolve(master_addr)
    return ip if interface_of(ip) is not None else route_source(ip)


class Listener:
    """A socket on this host's data address that answers each dial of the job (its token), once the dial's payload
    has come whole, with this host's node rank and the bytes it got: a thread per dial, until closed."""

    def __init__(self, addr: str, token: str, node: int, wait_s: float = 5.0) -> None:
        self.sock = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind((addr, 0))
        self.sock.listen(64)
        self.addr, self.port = addr, self.sock.getsockname()[1]
        self._hello, self._node, self._wait_s = HELLO + token.encode() + b" ", node, wait_s
        self._thread = threading.Thread(target=self._serve, name="pair-check", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._answer, args=(conn,), name="pair-check-dial", daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        """The dial's first line (the token, the dialling host, the payload's length), then its payload, answered."""
        with conn:
            conn.settimeout(self._wait_s)
            try:
                got = b""
                while b"\n" not in got and len(got) < 512:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    got += chunk
                line, _, rest = got.partition(b"\n")
                words = line[len(self._hello):].split()
                if not line.startswith(self._hello) or len(words) != 2 or not words[1].isdigit():
                    return
                left = int(words[1]) - len(rest)
                while left > 0:
                    chunk = conn.recv(min(left, 1 << 16))
                    if not chunk:
                        return
                    left -= len(chunk)
                conn.sendall(f"ok {self._node} {words[1].decode()}\n".encode())
            except OSError:
                return

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self._thread.join(timeout=5.0)


def dial(addr: str, port: int, token: str, node: int, peer: int, timeout_s: float, payload: int = PAYLOAD) -> str:
    """Host ``node``'s dial of host ``peer`` at ``addr``:``port``, with ``payload`` bytes (full-size segments: a path
    that passes a handshake but drops large packets, an MTU set wrong on one side, fails it as it fails a collective):
    "" where it answered as that host, having got them all, else what happened instead."""
    where = f"{addr}:{port}"
    try:
        with socket.create_connection((addr, port), timeout=timeout_s) as s:
            s.settimeout(timeout_s)
            s.sendall(HELLO + f"{token} {node} {payload}\n".encode() + bytes(payload))
            answer = s.recv(64)
    except (TimeoutError, socket.timeout):
        return f"no answer from {where} within {timeout_s:g} s"
    except OSError as e:
        return f"{where}: {e.strerror or e}"
    return "" if answer == f"ok {peer} {payload}\n".encode() else f"{where} answered, but not as host {peer}"


@dataclass(frozen=True, kw_only=True)
class PairBoard:
    """The check's keys in the job's channel (each under ``pairs/``: JobChannel.say_pairs, JobChannel.pairs), as three
    calls: ``put(key, value)``, ``get(key)`` (None: not there)
    and ``stopping()`` (this host's share is asked to stop: every wait gives up); ``look_s``: how often a wait asks
    again (a board in this process's memory, as the tests keep one, may be asked far more often than a store);
    ``clock`` and ``sleep``: the time a wait reads and spends (runner.common.polling)."""

    put: Callable[[str, object], None]
    get: Callable[[str], object]
    stopping: Callable[[], bool]
    look_s: float = LOOK_S
    clock: Clock = time.monotonic
    sleep: Sleep = time.sleep

    def gather(self, keys: Mapping[int, str], wait_s: float) -> dict[int, object]:
        """The values of ``keys`` (by node) found within ``wait_s`` (those found when it gives up)."""
        found: dict[int, object] = {}

        def look() -> dict[int, object]:
            for node, key in keys.items():
                if node not in found and (value := self.get(key)) is not None:
                    found[node] = value
            return found

        poll(look, lambda seen: len(seen) == len(keys) or self.stopping(), wait_s, self.look_s, clock=self.clock,
             sleep=self.sleep)
        return found


def check_pairs(board: PairBoard, attempt: int, node: int, hosts: int, addr: str | None, token: str,
                timeout_s: float, gather_s: float, no_addr: str = "",
                hung: tuple[int, str] | None = None) -> Verdict | Absent | None:
    """This host's part of the check of ``attempt`` (the module docstring): the verdict every host reads (host 0
    makes it); the hosts that did not say where they listen within ``gather_s`` (:class:`Absent`); or None where the
    check could not be made (host 0 made no verdict, or this share is stopping): the attempt goes on as it would have
    without it. ``addr`` None: this host has no address on the data network (``no_addr`` says why): it says so, as
    every pair of its failing, and dials nobody. ``hung`` (host 0's): the host that hung the two attempts before and
    why (runner.worker.hung_hosts), named where every pair answered."""
    base = f"{attempt}/"
    listener = Listener(addr, token, node, wait_s=timeout_s) if addr is not None else None
    try:
        board.put(f"{base}at/{node}", [listener.addr, listener.port] if listener else ["", 0])
        where = board.gather({h: f"{base}at/{h}" for h in range(hosts)}, gather_s)
        if board.stopping():
            return None
        if len(where) < hosts:
            return Absent(tuple(h for h in range(hosts) if h not in where))
        if listener is None:
            heard = {h: f"no address on the data network: {no_addr}" for h in where if h != node}
        else:
            heard = _dial_every(where, node, token, timeout_s)
        board.put(f"{base}heard/{node}", {str(h): why for h, why in heard.items()})
        if node == 0:
            said = board.gather({h: f"{base}heard/{h}" for h in range(hosts)}, timeout_s + SAID_WITHIN_S)
            found = verdict(hosts, {h: {int(j): str(w) for j, w in d.items()} for h, d in said.items()
                                    if isinstance(d, dict)})
            if found.named is None and hung is not None:
                found = Verdict(failed={}, named=hung[0], hung=hung[1])
            board.put(f"{base}verdict", found.document())
            if found.named is not None:  # the attempt ends: the store stays until the others read why
                board.gather({h: f"{base}read/{h}" for h in range(1, hosts)}, READ_WAIT_S)
            return found
        made = board.gather({0: f"{base}verdict"}, timeout_s + 2 * SAID_WITHIN_S).get(0)
        board.put(f"{base}read/{node}", True)
        return Verdict.of(made)
    finally:
        if listener is not None:
            listener.close()


def _dial_every(where: dict[int, object], node: int, token: str, timeout_s: float) -> dict[int, str]:
    """Host ``node``'s dials of every other host where it says it listens, at once: what each found."""
    peers = {h: _where(at) for h, at in where.items() if h != node}
    with ThreadPoolExecutor(max_workers=min(32, max(1, len(peers)))) as pool:
        dials = {h: pool.submit(dial, at[0], at[1], token, node, h, timeout_s) for h, at in peers.items() if at}
        return {h: dials[h].result() if h in dials else f"host {h} has no address on the data network"
                for h in peers}


def _where(at: object) -> tuple[str, int] | None:
    """A host's ``at`` value (its address and port), or None where it is not one."""
    if isinstance(at, list) and len(at) == 2 and isinstance(at[0], str) and at[0] and isinstance(at[1], int):
        return at[0], at[1]
    return None
