"""``run --reach ADDR PORT NODE``: can this host resolve and reach host 0's rendezvous address, where its ranks will
dial the store? The ssh launch's check asks every host this before anything starts (runner.launchers.ssh.check), so a
master that does not resolve, or that a firewall or a missing route hides, is refused in seconds, naming the host,
the address and the fix — instead of half a minute of c10d's retries once the job has started.

The answer is one JSON line on stdout (:class:`Reached`). Nothing listens on host 0's port before the job starts, so
"reached" means a host answered: a refused connection is a host's answer (its kernel's reset), silence until
:data:`REACH_S` or no route is not. Host 0 itself (the address is one of its own) checks that the port is free to
listen on instead."""

from __future__ import annotations

import errno
import ipaddress
import json
import socket
import sys
from dataclasses import asdict, dataclass

from runner.common import exits
from runner.worker.network import NetworkError, interface_of, resolve

REACH_S = 5.0  # how long a host waits for host 0's answer before it calls it unreachable
USAGE = "usage: run --reach <address> <port> <node rank>  (asked by launcher=ssh's check on every host)"


@dataclass(frozen=True, kw_only=True)
class Reached:
    """One host's answer: whether it can dial ``addr``:``port``, what it found, and the fix when it cannot."""

    ok: bool
    said: str
    hint: str = ""

    def line(self) -> str:
        return json.dumps({"reach": asdict(self)})

    @classmethod
    def parse(cls, text: str) -> Reached | None:
        """The answer in a check's output (its first line that is one); None: there is none."""
        for line in text.splitlines():
            try:
                found = json.loads(line)
            except ValueError:
                continue
            if isinstance(found, dict) and isinstance(found.get("reach"), dict):
                r = found["reach"]
                return cls(ok=bool(r.get("ok")), said=str(r.get("said", "")), hint=str(r.get("hint", "")))
        return None


def reach(addr: str, port: int, node: int, timeout_s: float = REACH_S) -> Reached:
    """Whether host ``node`` (this one) can reach host 0's rendezvous at ``addr``:``port`` (the module docstring)."""
    fix = "give host 0 an address every host can reach and resolve: topology.hosts[0].addr=IP (or init.master_addr)"
    try:
        ip = resolve(addr)
    except NetworkError as e:
        return Reached(ok=False, said=f"{addr!r} does not resolve on this host ({e.message.rsplit('(', 1)[-1]}",
                       hint=f"{fix}, or make the name known there (/etc/hosts, DNS)")
    shown = addr if ip == addr else f"{addr} ({ip})"
    if ipaddress.ip_address(ip).is_loopback:
        return Reached(ok=False, said=f"{shown} is this host's loopback: it would dial itself", hint=fix)
    if interface_of(ip) is not None:
        if node != 0:
            return Reached(ok=False, said=f"{shown} is an address of this very host, not host 0's", hint=fix)
        return _port_free(shown, port)
    return _answers(shown, ip, port, timeout_s, fix)


def _port_free(shown: str, port: int) -> Reached:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError as e:
            return Reached(ok=False, said=f"port {port} is taken on host 0 ({e.strerror}): the store cannot listen "
                                          f"there", hint="another job holds it: another run_id derives another port, "
                                                         "or set init.master_port")
    return Reached(ok=True, said=f"{shown} is this host's; port {port} is free for the store")


def _answers(shown: str, ip: str, port: int, timeout_s: float, fix: str) -> Reached:
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        try:
            s.connect((ip, port))
        except ConnectionRefusedError:
            return Reached(ok=True, said=f"{shown} answered on port {port} (nothing listens there yet)")
        except (TimeoutError, socket.timeout):
            return Reached(ok=False, said=f"{shown} gave no answer on port {port} within {timeout_s:g} s",
                           hint=f"a firewall between the hosts, or a route that leads nowhere (ip route get {ip}); "
                                f"or {fix}")
        except OSError as e:
            unreachable = e.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH)
            return Reached(ok=False, said=f"{shown} port {port}: {e.strerror}",
                           hint=f"no route from this host to it (ip route get {ip}); {fix}" if unreachable else fix)
    return Reached(ok=True, said=f"{shown} answered on port {port}")


def main(argv: list[str]) -> int:
    """``run --reach ADDR PORT NODE``: this runner's versions (the line `run --version` prints: the ssh check reads
    both from one interpreter) and the answer, on stdout; exit 0 when it could be given (yes or no), 2 on a bad
    command line."""
    from runner.environments import versions

    if len(argv) != 3 or not argv[1].isdigit() or not argv[2].isdigit():
        print(USAGE, file=sys.stderr)
        return exits.INVALID
    print(versions.installed().line(), flush=True)
    print(reach(argv[0], int(argv[1]), int(argv[2])).line(), flush=True)
    return exits.OK
