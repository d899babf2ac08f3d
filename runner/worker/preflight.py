"""preflight=true: the job launched as a real run would be, but instead of the recipe each host checks
its network and devices and every process takes part in one small all-reduce.

On each host, before any rank starts (runner.worker.supervise for per-host launching; runner.app.task for one
task per process, where the host's local rank 0 checks), in this order, stopping at the first failure:

1. the master address resolves; on hosts other than host 0, not to loopback unless every host is this
   machine (on host 0 itself a loopback master is fine: Debian maps a host's own name to 127.0.1.1);
2. a route leads there (on host 0 with a loopback master: to another host), and the interface gloo/NCCL
   will use, and why; with gloo left to itself, the address this host's name resolves to must not be
   loopback (gloo would listen there);
3. rendezvous -- env:// and tcp://: host 0 holds the port (it serves the store there) and every host
   opens a TCP connection to master:port, a refused one retried for a short while since host 0 may
   start later; file://: the init file's folder exists and is writable here;
4. the host has the devices the spec gives it.

Then every process runs :func:`collective`: init_process_group with the exact spec, an all-reduce of
rank + 1, a check of the sum, destroy_process_group, all under a short timeout. Each host's local
rank 0 prints the host's line::

    preflight node1 (tb1234h2, 10.0.0.12): master tb1234h1 -> 10.0.0.11 (not loopback) · route via lan0 ...

A failed check ends the line with ``FAILED: what — hint: what to do``, and the host (or the process)
exits 1 at once; its launcher then stops the others.
"""

from __future__ import annotations

import datetime
import errno
import ipaddress
import json
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from runner.worker.network import NetworkError, interface_of, resolve, route_source
from runner.plan.processes import Deferred, Plan
from runner.spec.schema import DeviceKind, InitMethod, LauncherKind
from runner.spec.topology import Host, is_loopback

if TYPE_CHECKING:
    from torch.distributed.elastic.multiprocessing.api import RunProcsResult

    from runner.worker.network import InterfaceChoice
    from runner.plan.paths import RunPaths
    from runner.worker.rank import RankSetup

COLLECTIVE_TIMEOUT_S = 30.0  # rendezvous + all-reduce at most (init.timeout_s when that is shorter)
DEADLINE_GRACE_S = 5.0  # after that timeout, the collective is given up on (not every wait honours it)
CONNECT_ATTEMPT_S = 3.0  # one TCP connection attempt to master:port
CONNECT_WINDOW_S = 10.0  # how long a refused port is tried again: host 0 may start a little later
MANUAL_CONNECT_WINDOW_S = 30.0  # launcher=manual: hosts are started by hand, one after the other
EXIT_FAILED = 1


@dataclass(frozen=True)
class Check:
    """One finding on a host: what was found (``text``), or why it fails (``failure``) and what to do."""

    text: str
    failure: str | None = None
    hint: str = ""

    @classmethod
    def failed(cls, failure: str, hint: str = "") -> Check:
        return cls("", failure, hint)

    @property
    def ok(self) -> bool:
        return self.failure is None

    def render(self) -> str:
        return self.text if self.ok else f"FAILED: {self.failure}" + (f" — hint: {self.hint}" if self.hint else "")


@dataclass(frozen=True)
class HostReport:
    """A host's line: who it is, then its checks in order (a failed one is the last)."""

    header: str  # "preflight node1 (tb1234h2, 10.0.0.12)"
    checks: tuple[Check, ...] = ()

    @property
    def failed(self) -> bool:
        return any(not c.ok for c in self.checks)

    def add(self, check: Check) -> HostReport:
        return replace(self, checks=(*self.checks, check))

    def line(self) -> str:
        return f"{self.header}: " + " · ".join(c.render() for c in self.checks)


class PreflightFailed(Exception):
    """A process's preflight failed; the message is its line."""


def collective_timeout_s(init_timeout_s: float) -> float:
    return min(init_timeout_s, COLLECTIVE_TIMEOUT_S)


def _is_loopback_ip(ip: str) -> bool:
    return ipaddress.ip_address(ip).is_loopback


# -------------------------------------------------------------------------- the checks, one by one


def check_master(addr: str, hosts: int, one_machine: bool, master_host: bool) -> tuple[Check, str | None]:
    """The master address resolves here, and not to loopback where other machines' processes must reach
    host 0 through it. Also the IP address it stands for (None when the check fails).

    ``one_machine``: every host of the job is this machine; ``master_host``: this is host 0."""
    try:
        ip = resolve(addr)
    except NetworkError as e:
        return Check.failed(e.message, "name resolution: add the name to /etc/hosts or DNS on every host, or give "
                                       "init.master_addr as an IP address"), None
    shown = f"master {addr}" if ip == addr else f"master {addr} -> {ip}"
    if not _is_loopback_ip(ip):
        return Check(f"{shown} (not loopback)"), ip
    if hosts == 1:
        return Check(f"{shown} (loopback: one host)"), ip
    if one_machine:
        return Check(f"{shown} (loopback: every host is this machine)"), ip
    if master_host:
        return Check(f"{shown} (loopback here, on host 0 itself)"), ip
    how = f"{addr} resolves to {ip} on this host" if ip != addr else f"{ip} is every host's own address"
    return Check.failed(f"the master address {addr} -> {ip} is loopback, but the job has {hosts} hosts: this host "
                        f"would dial itself, not host 0",
                        f"name resolution: {how} (/etc/hosts maps the name to 127.0.x.x?); give init.master_addr as "
                        f"host 0's address on the network, or map the name to it"), None


def check_route(ip: str, to: str | None = None) -> tuple[Check, str | None, str | None]:
    """A route from this host to ``ip`` (``to``: whose address it is, when not the master's): the check,
    this host's address on the route and its interface."""
    what = f"host {to} ({ip})" if to else f"the master {ip}"
    try:
        source = route_source(ip)
    except NetworkError as e:
        return Check.failed(f"no route from this host to {what}" if to else e.message,
                            f"interface or routing: `ip route get {ip}` says where packets for it go"), None, None
    name = interface_of(source)
    if name is None:
        return Check.failed(f"the route to {what} leaves from {source}, which no interface of this host holds",
                            f"interface: check `ip -br addr` and `ip route get {ip}`"), source, None
    return Check(f"route{f' to host {to}' if to else ''} via {name} ({source})"), source, name


def check_interface(choice: InterfaceChoice | None, route_ifname: str | None, spec_ifname: str | None,
                    given: str | None, backend: str, interfaces: frozenset[str], own_name_ip: str | None,
                    one_machine: bool, pick_interface: bool = True) -> Check:
    """The interface gloo/NCCL will use and who chose it. With gloo, which binds by name, a named
    interface this host lacks fails; left to itself, gloo listens on the address this host's name
    resolves to (``own_name_ip``), which must not be loopback.

    ``choice``: the runner's (runner.worker.supervise.network_choice); ``given``: GLOO_SOCKET_IFNAME as the
    user set it (backend.env or the environment); ``one_machine``: every host is this machine."""
    chosen = choice.env.get("GLOO_SOCKET_IFNAME") if choice else None
    used = spec_ifname or chosen or given
    if used is None:
        if one_machine:
            return Check("loopback between the processes (every host is this machine)")
        why = "backend.pick_interface=false" if not pick_interface else \
            "the runner found no route to another host: the master is loopback here and the others are unnamed"
        if backend == "gloo" and own_name_ip is not None and _is_loopback_ip(own_name_ip):
            route = f" ({route_ifname})" if route_ifname and route_ifname != "lo" else ""
            return Check.failed(f"gloo picks its interface itself ({why}) and would listen on {own_name_ip}, the "
                                f"loopback address this host's name resolves to: the other hosts cannot connect to it",
                                ("interface: leave backend.pick_interface=true (the route's interface), " if not
                                 pick_interface else "interface: name the hosts (topology.hosts), ")
                                + f"or set backend.socket_ifname{route}; or map this host's name to its network "
                                  f"address (/etc/hosts)")
        return Check(f"gloo/NCCL pick their interface themselves ({why})")
    why = "backend.socket_ifname" if spec_ifname else "the route's" if chosen else "GLOO_SOCKET_IFNAME set by the user"
    if backend == "gloo":
        missing = [n for n in used.split(",") if n not in interfaces]
        if missing:
            return Check.failed(f"interface {', '.join(missing)} ({why}) is not on this host (it has "
                                f"{', '.join(sorted(interfaces))})",
                                "interface: name one of this host's" + (f", e.g. the route's: {route_ifname}"
                                                                        if route_ifname else ""))
    if used == route_ifname or route_ifname is None:
        return Check(f"gloo/NCCL on {used} ({why})")
    return Check(f"gloo/NCCL on {used} ({why}; the route leaves via {route_ifname})")


def hold_port(bind: str, port: int) -> tuple[socket.socket | None, Check]:
    """Listen on ``port`` for the checks (a task that serves the store itself later, one task per
    process): the port is free, and dialing master:port from here reaches it. Close the socket before
    the store binds the port."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((bind, port))
        s.listen(16)
    except OSError as e:
        s.close()
        return None, Check.failed(f"port {port} is not free on this host (host 0): cannot listen on {bind}:{port} "
                                  f"({e.strerror})", "another job holds the port; leave init.master_port=0 (a free "
                                  "port per run), or pick another")
    return s, Check(f"port {port} free")


def connect_failure(ip: str, port: int, err: OSError, ifname: str | None, waited_s: float, serving_here: bool) -> Check:
    """Why connecting to ``ip:port`` failed, in words, with the likely cause."""
    via = f" (reached via {ifname})" if ifname else ""
    if isinstance(err, ConnectionRefusedError):
        if serving_here:
            return Check.failed(f"this host (host 0) serves the rendezvous on port {port}, but port {port} on {ip} "
                                f"refused the connection: the master address leads elsewhere",
                                "init.master_addr must be host 0's address (or leave it out)")
        tried = f" for {waited_s:.0f} s" if waited_s >= 1 else ""
        return Check.failed(f"port {port} on {ip}{via} refused the connection{tried}: nothing listens there",
                            "is host 0 started, and is init.master_addr host 0's address? a firewall that rejects?")
    if isinstance(err, TimeoutError):  # socket.timeout is TimeoutError
        return Check.failed(f"no answer from {ip}:{port} within {CONNECT_ATTEMPT_S:.0f} s{via}",
                            f"firewall: something drops packets to port {port} (host 0 must accept the master port, "
                            f"and gloo/NCCL's own ports, from every host); or the route leads nowhere: "
                            f"`ip route get {ip}`")
    if err.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return Check.failed(f"{ip}:{port} is unreachable from this host ({err.strerror}){via}",
                            f"interface or routing: `ip route get {ip}`; or a firewall that rejects as unreachable")
    return Check.failed(f"cannot connect to {ip}:{port} ({err.strerror or err}){via}", "firewall or routing")


def check_reachable(ip: str, port: int, window_s: float, ifname: str | None = None,
                    serving_here: bool = False) -> Check:
    """A TCP connection to ``ip:port`` opens. A refused one is tried again for ``window_s`` (host 0 may be
    starting still), unless this host serves the port itself; timeouts and unreachable networks are not."""
    start = time.monotonic()
    while True:
        try:
            with socket.create_connection((ip, port), timeout=CONNECT_ATTEMPT_S):
                return Check(f"port {port} {'free and served here' if serving_here else 'reachable'}")
        except OSError as e:
            waited = time.monotonic() - start
            if not isinstance(e, ConnectionRefusedError) or serving_here or waited >= window_s:
                return connect_failure(ip, port, e, ifname, waited, serving_here)
        time.sleep(0.25)


def check_init_folder(folder: Path) -> Check:
    """The init file's folder exists and this host can write there (it makes and removes a file)."""
    if not folder.is_dir():
        return Check.failed(f"the init file's folder {folder} does not exist on this host",
                            f"shared storage: init.dir must be a folder every host sees at the same path (mkdir -p "
                            f"{folder} there, or mount it here)")
    try:
        fd, name = tempfile.mkstemp(prefix=".preflight-", dir=folder)
        os.close(fd)
        os.unlink(name)
    except OSError as e:
        return Check.failed(f"the init file's folder {folder} is not writable from this host ({e.strerror})",
                            "permissions or a read-only mount: every host's processes write the init file")
    return Check(f"init file folder {folder} writable")


def check_devices(host: Host, device: DeviceKind, processes: int, need: int, have: int | None) -> Check:
    """The host has what the spec gives it: CPU processes always; GPUs: ``need`` visible, ``have`` are."""
    if device is not DeviceKind.cuda:
        return Check(f"{processes} CPU process(es) as the spec says")
    gpus = ",".join(map(str, host.gpus))
    if not have or have < need:
        return Check.failed(f"the spec gives this host {host.devices} GPU(s) (GPUs {gpus}), but "
                            f"torch.cuda.device_count() = {have or 0} here",
                            f"devices: at most {have or 0} here (topology.devices_per_node, or "
                            f"topology.hosts[{host.index}].gpus); or check CUDA_VISIBLE_DEVICES and the allocation's "
                            f"GPUs (--gpus-per-node)")
    return Check(f"{host.devices} GPU(s) as the spec says (GPUs {gpus} of {have})")


# -------------------------------------------------------------------------- a host's checks together


def _one_machine(hosts: Sequence[Host], names: frozenset[str]) -> bool:
    """Every "host" is this machine (validation allows a loopback master for that case only)."""
    return all(h.reach is not None and (is_loopback(h.reach) or h.reach in names) for h in hosts)


def _peer(hosts: Sequence[Host], node_rank: int) -> tuple[str, str] | None:
    """Another host with a non-loopback address here: (its name or address, the IP address)."""
    for h in hosts:
        if h.index != node_rank and h.reach:
            try:
                ip = resolve(h.reach)
            except NetworkError:
                continue
            if not _is_loopback_ip(ip):
                return h.reach, ip
    return None


def _own_name_ip() -> str | None:
    try:
        return resolve(socket.gethostname())
    except NetworkError:
        return None


def _header(plan: Plan, node_rank: int, environ: Mapping[str, str], source: str | None) -> str:
    """``preflight <label> (<machine>, <address>)``: the machine as the launcher knows it (Slurm's node
    name) or its host name, and this host's address on the route to the master."""
    host = plan.job.hosts[node_rank]
    where = host.name or socket.gethostname()
    if plan.job.spec.launcher.kind is LauncherKind.slurm:
        from runner.environments.slurm import SlurmEnvironment

        where = SlurmEnvironment.read(environ).node_name or where
    parts = [p for p in (where if where != host.label else None, source) if p]
    return f"preflight {host.label}" + (f" ({', '.join(parts)})" if parts else "")


def _gpus_needed(plan: Plan, node_rank: int) -> int:
    """Visible GPUs the host's processes index into: Slurm shows a task its node's GPUs; elsewhere this
    process sees them all and gives each rank the spec's indices (CUDA_VISIBLE_DEVICES)."""
    if plan.job.spec.launcher.kind is LauncherKind.slurm:
        return max(max(r.device_ids, default=0) for r in plan.host_records(node_rank)) + 1
    return max(plan.job.hosts[node_rank].gpus) + 1


def host_checks(plan: Plan, node_rank: int, environ: Mapping[str, str]) -> tuple[HostReport, int | None]:
    """Host ``node_rank``'s checks (the module docstring says which), up to the first failure, made
    before any of its processes starts; and the master port (env/tcp init; None: file init).

    Host 0 listens on the master port meanwhile (a free one when the plan leaves it to the launch), so
    that connecting to master:port tests the way to it; the caller's store binds that port after. (A
    store made first would wait for itself up to init.timeout_s when the master address leads elsewhere.)
    """
    port = None if plan.job.spec.init.method is InitMethod.file else \
        (0 if isinstance(plan.master_port, Deferred) else int(plan.master_port))
    sock, held = None, None
    if port is not None and node_rank == 0:
        sock, held = hold_port("127.0.0.1" if len(plan.job.hosts) == 1 else "0.0.0.0", port)
        port = sock.getsockname()[1] if sock is not None else port
    try:
        return _checks(plan, node_rank, environ, port, held), port
    finally:
        if sock is not None:
            sock.close()


def _checks(plan: Plan, node_rank: int, environ: Mapping[str, str], port: int | None, held: Check | None) -> HostReport:
    """``held``: on host 0, whether it holds the port (or why not)."""
    from runner.worker.supervise import network_choice
    from runner.spec.probe import LocalProbe

    job, spec = plan.job, plan.job.spec
    hosts = job.hosts
    file_init = spec.init.method is InitMethod.file
    probe = LocalProbe()
    checks: list[Check] = []
    source: str | None = None

    def done(check: Check | None = None) -> HostReport:
        if check is not None:
            checks.append(check)
        return HostReport(_header(plan, node_rank, environ, source), tuple(checks))

    master = plan.master_addr
    if not (file_init and len(hosts) == 1) and not isinstance(master, Deferred):
        one_machine = _one_machine(hosts, probe.host_names())
        check, ip = check_master(master, len(hosts), one_machine, node_rank == 0)
        if ip is None:
            return done(check)
        checks.append(check)
        # host 0 whose own name is loopback here: the way to the others is the route to one of them
        peer = _peer(hosts, node_rank) if _is_loopback_ip(ip) and len(hosts) > 1 else None
        check, source, ifname = check_route(peer[1], to=peer[0]) if peer else check_route(ip)
        if not check.ok:
            return done(check)
        checks.append(check)
        if len(hosts) > 1:
            try:
                choice = network_choice(plan, node_rank)
            except NetworkError as e:
                return done(Check.failed(e.message, e.hint))
            given = spec.backend.env.get("GLOO_SOCKET_IFNAME") or environ.get("GLOO_SOCKET_IFNAME")
            check = check_interface(choice, ifname, spec.backend.socket_ifname, given, job.backend.value,
                                    frozenset(_interfaces()), _own_name_ip(), one_machine,
                                    spec.backend.pick_interface)
            if not check.ok:
                return done(check)
            checks.append(check)
        if not file_init:
            if held is not None and not held.ok:
                return done(held)
            if port is not None:
                window = MANUAL_CONNECT_WINDOW_S if spec.launcher.kind is LauncherKind.manual else CONNECT_WINDOW_S
                check = check_reachable(ip, port, min(window, spec.init.timeout_s), ifname, held is not None)
                if not check.ok:
                    return done(check)
                checks.append(check)
    if file_init:
        # init.dir (or the run folder), which holds the run's private <run id>.rdzv folder
        check = check_init_folder(Path(plan.init_method.removeprefix("file://")).parent.parent)
        if not check.ok:
            return done(check)
        checks.append(check)
    have = probe.cuda_device_count() if job.device is DeviceKind.cuda else None
    return done(check_devices(hosts[node_rank], job.device, len(plan.host_records(node_rank)),
                              _gpus_needed(plan, node_rank), have))


def _interfaces() -> list[str]:
    import psutil

    return list(psutil.net_if_addrs())


# -------------------------------------------------------------------------- every process


def _explain(e: BaseException, setup: RankSetup, timeout_s: float) -> Check:
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    text = f"{type(e).__name__}: {first}"[:300]
    lowered = str(e).lower()
    if "timed out" in lowered or "timeout" in lowered:
        shared = "; init=file: is init.dir shared by every host?" if setup.init_method.startswith("file://") else ""
        return Check.failed(f"the processes did not all meet within {timeout_s:.0f} s ({text})",
                            f"is every host started (each prints its own preflight line)? a firewall between the "
                            f"hosts?{shared}")
    if any(w in lowered for w in ("refused", "connect", "network", "unreachable")):
        iface = setup.env.get("GLOO_SOCKET_IFNAME") or setup.env.get("NCCL_SOCKET_IFNAME")
        on = f" (this host's processes use {iface})" if iface else ""
        return Check.failed(f"the processes could not connect to each other{on}: {text}",
                            "firewall or interface: gloo/NCCL connect the processes directly, on ports besides "
                            "init.master_port: open them between the hosts; check the interface on every host "
                            "(backend.socket_ifname)")
    return Check.failed(text, f"the traceback is in {setup.log_file}")


def _all_reduce(setup: RankSetup, device: object, timeout_s: float) -> float:
    import torch
    import torch.distributed as dist

    rec = setup.record
    if getattr(device, "type", None) == "cuda":
        torch.cuda.set_device(device)  # the current device is per thread
    dist.init_process_group(setup.backend, init_method=setup.init_method, rank=rec.global_rank,
                            world_size=setup.world_size, timeout=datetime.timedelta(seconds=timeout_s))
    try:
        t = torch.tensor([float(rec.global_rank + 1)], device=device)
        dist.all_reduce(t)
        return t.item()  # waits for the device
    finally:
        dist.destroy_process_group()


def collective(setup: RankSetup, device: object) -> None:
    """init_process_group with the exact spec, all-reduce rank + 1, check the sum, destroy the group,
    within a short deadline. The host's reporting process prints the host's line; a failure raises
    PreflightFailed with the line.

    The collective runs in a daemon thread that is given up on at the deadline: the group's timeout
    does not bound everything (gloo's connect to an address that drops packets waits for the kernel's
    SYN retries, over two minutes); the process exits without it."""
    rec, world = setup.record, setup.world_size
    expected = world * (world + 1) // 2
    timeout_s = collective_timeout_s(setup.spec.init.timeout_s)
    deadline_s = timeout_s + DEADLINE_GRACE_S
    report = setup.preflight or HostReport(f"preflight {rec.host} rank {rec.global_rank}")
    what = f"{setup.backend} all-reduce over {world} process(es)"
    found: dict[str, object] = {}

    def work() -> None:
        try:
            found["total"] = _all_reduce(setup, device, timeout_s)
        except Exception as e:  # noqa: BLE001 (said in the line)
            found["error"] = e

    started = time.monotonic()
    worker = threading.Thread(target=work, name="preflight-all-reduce", daemon=True)
    worker.start()
    worker.join(deadline_s)
    if worker.is_alive():
        iface = setup.env.get("GLOO_SOCKET_IFNAME") or setup.env.get("NCCL_SOCKET_IFNAME")
        on = f" (this host's processes use {iface})" if iface else ""
        raise PreflightFailed(report.add(Check.failed(
            f"{what}: not done after {deadline_s:.0f} s: the processes are still connecting to each other{on}",
            "firewall or interface: gloo/NCCL connect the processes directly, on ports besides init.master_port; a "
            "firewall that drops those packets, or an interface that does not reach the other hosts "
            "(backend.socket_ifname), make the connections hang")).line())
    if "error" in found:
        error = found["error"]
        check = _explain(error, setup, timeout_s)
        raise PreflightFailed(report.add(replace(check, failure=f"{what}: {check.failure}")).line()) from error
    total = found["total"]
    if total != expected:
        raise PreflightFailed(report.add(Check.failed(
            f"{what} summed {total:g}, not {expected} (1 + ... + {world})",
            f"backend: {setup.backend} computed a wrong sum; try another backend (backend=gloo)")).line())
    if setup.preflight is not None:  # this host's reporting process
        print(report.add(Check(f"{what} ok (sum {expected}, {time.monotonic() - started:.2f} s)")).line(), flush=True)


def outcome(result: RunProcsResult, setups: Sequence[RankSetup], paths: RunPaths) -> int:
    """A host's preflight processes have ended: 0 when all passed, else the failure's line on stderr
    (the host's reporting process's, if it failed) and the exit status 1."""
    if not result.is_failed():
        return 0
    errors = []
    for s in setups:
        try:
            errors.append((s.preflight is None, json.loads(Path(s.error_file).read_text())))
        except (OSError, ValueError):
            continue
    errors.sort(key=lambda e: (e[0], e[1]["timestamp"]))
    if errors:
        print(errors[0][1]["exception"].removeprefix(f"{PreflightFailed.__name__}: "), file=sys.stderr)
    others = len(result.failures) - min(1, len(errors))
    also = f" ({others} other process(es) of this host failed or were stopped)" if others > 0 else ""
    print(f"preflight failed on {setups[0].record.host}{also}; per-rank logs: {paths.logs}/", file=sys.stderr)
    return EXIT_FAILED
