"""runner.worker.preflight.checks, one by one, with real sockets of this machine and no process started: what each
finds and how it fails (the address, the port, and a hint); a host's line of them. A whole preflight, here and on the
test bed's hosts: tests/worker/test_preflight.py."""

from __future__ import annotations

import errno
import functools
import socket
from types import SimpleNamespace

import pytest

from clocks import Clock
from runner.common.polling import retry
from runner.spec.schema import DeviceKind
from runner.spec.topology import Host
from runner.worker.network import InterfaceChoice
from runner.worker.preflight import checks
from runner.worker.preflight.checks import (
    REFUSED_AGAIN_S,
    Check,
    HostChecks,
    check_devices,
    check_init_folder,
    check_interface,
    check_master,
    check_reachable,
    connect_failure,
    hold_port,
)

pytestmark = pytest.mark.unit


# -------------------------------------------------------------------------- the checks, with real sockets


def test_a_closed_port_is_refused_with_its_address_and_port(closed_port):
    check = check_reachable("127.0.0.1", closed_port, window_s=0, ifname="lo")
    assert not check.ok
    assert f"port {closed_port} on 127.0.0.1 (reached via lo) refused the connection: nothing listens there" in \
        check.failure
    assert "is host 0 started" in check.hint and "init.master_addr" in check.hint and "firewall" in check.hint


def test_a_refused_port_is_tried_again_for_the_window_then_given_up(closed_port, monkeypatch):
    """Real refusals, on a made-up clock: tried every REFUSED_AGAIN_S until the window has passed, the last try at
    its end, then the failure says for how long."""
    clock, tries = Clock(), []
    real = socket.create_connection

    def connect(address, timeout):
        tries.append(clock())
        return real(address, timeout=timeout)

    monkeypatch.setattr(socket, "create_connection", connect)
    monkeypatch.setattr(checks, "retry", functools.partial(retry, clock=clock, sleep=clock.sleep))
    monkeypatch.setattr(checks, "time", SimpleNamespace(monotonic=clock))
    check = check_reachable("127.0.0.1", closed_port, window_s=1.0)
    assert tries == [0.0, 0.25, 0.5, 0.75, 1.0] and REFUSED_AGAIN_S == 0.25
    assert "refused the connection for 1 s" in check.failure


def test_a_connection_reset_while_host_0_hands_its_port_to_the_store_is_tried_again(listening_port, monkeypatch):
    """Host 0 holds the master port during its checks, then closes it and the store binds it: a connection caught
    in the first socket's queue is reset. The next try reaches the store."""
    tries = []
    real = socket.create_connection

    def connect(address, timeout):  # the first try meets the handover
        tries.append(address)
        if len(tries) == 1:
            raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
        return real(address, timeout=timeout)

    monkeypatch.setattr(socket, "create_connection", connect)
    monkeypatch.setattr(checks, "REFUSED_AGAIN_S", 0.0)  # the next try at once
    assert check_reachable("127.0.0.1", listening_port, window_s=10) == Check(f"port {listening_port} reachable")
    assert len(tries) == 2


def test_a_reset_on_the_host_that_serves_the_port_is_not_tried_again(listening_port, monkeypatch):
    def reset(address, timeout):
        raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")

    monkeypatch.setattr(socket, "create_connection", reset)
    check = check_reachable("127.0.0.1", listening_port, window_s=30, serving_here=True)
    assert not check.ok and "Connection reset by peer" in check.failure


def test_host_0_that_cannot_reach_its_own_store_names_the_master_address(closed_port):
    check = check_reachable("127.0.0.1", closed_port, window_s=30, serving_here=True)  # no retry: it would not help
    assert "this host (host 0) serves the rendezvous" in check.failure
    assert "the master address leads elsewhere" in check.failure
    assert "init.master_addr must be host 0's address" in check.hint


def test_a_listening_port_is_reachable(listening_port):
    assert check_reachable("127.0.0.1", listening_port, window_s=0) == Check(f"port {listening_port} reachable")


def test_a_bound_port_is_not_free_and_a_free_one_is_held_for_the_checks(listening_port):
    sock, check = hold_port("127.0.0.1", listening_port)
    assert sock is None and not check.ok
    assert f"port {listening_port} is not free" in check.failure and f"127.0.0.1:{listening_port}" in check.failure
    assert "init.master_port=0" in check.hint
    sock, check = hold_port("127.0.0.1", 0)
    try:
        port = sock.getsockname()[1]
        assert check.ok
        served = check_reachable("127.0.0.1", port, window_s=0, serving_here=True)
        assert served.text == f"port {port} free and served here"
    finally:
        sock.close()


def test_timeouts_and_unreachable_networks_point_to_firewall_and_routing():
    timeout = connect_failure("10.0.0.11", 23456, TimeoutError("timed out"), "lan0", 3.0, False)
    assert "no answer from 10.0.0.11:23456" in timeout.failure and "(reached via lan0)" in timeout.failure
    assert timeout.hint.startswith("firewall") and "port 23456" in timeout.hint
    unreachable = connect_failure("10.0.0.11", 23456, OSError(errno.EHOSTUNREACH, "No route to host"), "lan0", 0, False)
    assert "unreachable" in unreachable.failure and unreachable.hint.startswith("interface or routing")


def test_a_loopback_master_with_several_hosts_is_refused_on_the_others():
    check, ip = check_master("localhost", hosts=2, one_machine=False, master_host=False)
    assert ip is None and not check.ok
    assert "the master address localhost -> 127.0.0.1 is loopback, but the job has 2 hosts" in check.failure
    assert check.hint.startswith("name resolution") and "init.master_addr" in check.hint


@pytest.mark.parametrize("hosts, one_machine, master_host, why", [
    (1, False, False, "loopback: one host"),
    (2, True, False, "loopback: every host is this machine"),
    (2, False, True, "loopback here, on host 0 itself"),  # Debian's 127.0.1.1 for the host's own name
])
def test_a_loopback_master_is_fine_where_nobody_else_dials_it(hosts, one_machine, master_host, why):
    check, ip = check_master("localhost", hosts, one_machine, master_host)
    assert check.ok and ip == "127.0.0.1" and check.text == f"master localhost -> 127.0.0.1 ({why})"


def test_a_master_name_that_does_not_resolve_hints_at_name_resolution():
    check, ip = check_master("no-such-host.invalid", hosts=2, one_machine=False, master_host=False)
    assert ip is None and "'no-such-host.invalid' does not resolve" in check.failure
    assert check.hint.startswith("name resolution") and "/etc/hosts" in check.hint


def test_the_interface_gloo_would_use_is_checked():
    route = InterfaceChoice({"GLOO_SOCKET_IFNAME": "lan0", "NCCL_SOCKET_IFNAME": "lan0"}, "network: ...")
    assert check_interface(route, "lan0", None, None, "gloo", frozenset({"lo", "lan0"}), None, False).text == \
        "gloo/NCCL on lan0 (the route's)"
    named = InterfaceChoice({"GLOO_SOCKET_IFNAME": "ib0", "NCCL_SOCKET_IFNAME": "ib0"}, "network: ...")
    missing = check_interface(named, "lan0", "ib0", None, "gloo", frozenset({"lo", "lan0"}), None, False)
    assert "interface ib0 (backend.socket_ifname) is not on this host (it has lan0, lo)" in missing.failure
    assert "the route's: lan0" in missing.hint
    left = InterfaceChoice({}, "network: backend.pick_interface=false: gloo and NCCL choose their interface")
    own_loopback = check_interface(left, "lan0", None, None, "gloo", frozenset({"lo", "lan0"}), "127.0.1.1", False,
                                   pick_interface=False)
    assert "gloo picks its interface itself (backend.pick_interface=false) and would listen on 127.0.1.1, the " \
           "loopback address this host's name resolves to" in own_loopback.failure
    assert "backend.pick_interface=true" in own_loopback.hint and "backend.socket_ifname (lan0)" in own_loopback.hint
    assert check_interface(left, "lan0", None, None, "gloo", frozenset({"lan0"}), "10.0.0.12", False, False).ok


def test_devices_and_the_init_folder(tmp_path):
    host = Host(1, None, None, 2, (0, 1))
    assert check_devices(host, DeviceKind.cpu, 2, 2, None).text == "2 CPU process(es) as the spec says"
    assert check_devices(host, DeviceKind.cuda, 2, 2, 8).text == "2 GPU(s) as the spec says (GPUs 0,1 of 8)"
    few = check_devices(host, DeviceKind.cuda, 2, 2, 1)
    assert "gives this host 2 GPU(s) (GPUs 0,1), but torch.cuda.device_count() = 1" in few.failure
    assert check_init_folder(tmp_path).ok
    assert not list(tmp_path.iterdir())  # its probe file is gone
    gone = check_init_folder(tmp_path / "missing")
    assert "does not exist on this host" in gone.failure and gone.hint.startswith("shared storage")


def test_a_host_line_lists_its_checks_and_ends_at_a_failure():
    report = HostChecks("preflight node1 (h2, 10.0.0.12)", (Check("master h1 -> 10.0.0.11 (not loopback)"),))
    assert report.line() == "preflight node1 (h2, 10.0.0.12): master h1 -> 10.0.0.11 (not loopback)"
    failed = report.add(Check.failed("port 1 refused", "a firewall?"))
    assert failed.failed and failed.line().endswith(" · FAILED: port 1 refused — hint: a firewall?")
