"""A host's preflight checks together, made before any of its processes starts (runner.worker.preflight)."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from pathlib import Path

from runner.environments.process import ProcessEnvironment
from runner.plan.processes import Deferred, Plan
from runner.spec.probe import LocalProbe
from runner.spec.schema import DeviceKind, InitMethod
from runner.spec.topology import Host, is_loopback
from runner.worker.network import NetworkError, network_choice, resolve
from runner.worker.preflight.checks import (
    CONNECT_WINDOW_S,
    MANUAL_CONNECT_WINDOW_S,
    Check,
    HostChecks,
    is_loopback_ip,
    check_devices,
    check_init_folder,
    check_interface,
    check_master,
    check_reachable,
    check_route,
    hold_port,
)



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
            if not is_loopback_ip(ip):
                return h.reach, ip
    return None


def _own_name_ip() -> str | None:
    try:
        return resolve(socket.gethostname())
    except NetworkError:
        return None


def _header(plan: Plan, node_rank: int, environment: ProcessEnvironment, source: str | None) -> str:
    """``preflight <label> (<machine>, <address>)``: the machine as the scheduler knows it (Slurm's node
    name) or its host name, and this host's address on the route to the master."""
    host = plan.job.hosts[node_rank]
    where = environment.slurm.node_name or host.name or socket.gethostname()
    parts = [p for p in (where if where != host.label else None, source) if p]
    return f"preflight {host.label}" + (f" ({', '.join(parts)})" if parts else "")


def _gpus_needed(plan: Plan, node_rank: int) -> int:
    """Visible GPUs the host's processes index into: a scheduler that sets CUDA_VISIBLE_DEVICES itself
    (Slurm) shows a task its node's GPUs; elsewhere this process sees them all and gives each rank the
    spec's indices (CUDA_VISIBLE_DEVICES)."""
    if not plan.rules.sets_visible_devices:
        return max(max(r.device_ids, default=0) for r in plan.host_records(node_rank)) + 1
    return max(plan.job.hosts[node_rank].gpus) + 1


def host_checks(plan: Plan, node_rank: int, environment: ProcessEnvironment) -> tuple[HostChecks, int | None]:
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
        return _checks(plan, node_rank, environment, port, held), port
    finally:
        if sock is not None:
            sock.close()


def _checks(plan: Plan, node_rank: int, environment: ProcessEnvironment, port: int | None,
            held: Check | None) -> HostChecks:
    """``held``: on host 0, whether it holds the port (or why not)."""
    job, spec = plan.job, plan.job.spec
    hosts = job.hosts
    file_init = spec.init.method is InitMethod.file
    probe = LocalProbe()
    checks: list[Check] = []
    source: str | None = None

    def done(check: Check | None = None) -> HostChecks:
        if check is not None:
            checks.append(check)
        return HostChecks(_header(plan, node_rank, environment, source), tuple(checks))

    master = plan.master_addr
    if not (file_init and len(hosts) == 1) and not isinstance(master, Deferred):
        one_machine = _one_machine(hosts, probe.host_names())
        check, ip = check_master(master, len(hosts), one_machine, node_rank == 0)
        if ip is None:
            return done(check)
        checks.append(check)
        # host 0 whose own name is loopback here: the way to the others is the route to one of them
        peer = _peer(hosts, node_rank) if is_loopback_ip(ip) and len(hosts) > 1 else None
        check, source, ifname = check_route(peer[1], to=peer[0]) if peer else check_route(ip)
        if not check.ok:
            return done(check)
        checks.append(check)
        if len(hosts) > 1:
            try:
                choice = network_choice(plan, node_rank, environment)
            except NetworkError as e:
                return done(Check.failed(e.message, e.hint))
            given = spec.backend.env.get("GLOO_SOCKET_IFNAME") or environment.socket_ifnames.get("GLOO_SOCKET_IFNAME")
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
                window = MANUAL_CONNECT_WINDOW_S if plan.rules.hosts_start_apart else CONNECT_WINDOW_S
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
    return done(check_devices(hosts[node_rank], job.device, plan.processes_per_host[node_rank],
                              _gpus_needed(plan, node_rank), have))


def _interfaces() -> list[str]:
    import psutil

    return list(psutil.net_if_addrs())


