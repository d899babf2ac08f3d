"""runner.worker.network: the interface of the route to the master, and the user's choice winning over it
(real routes of this machine; the namespace hosts with a decoy interface are in the multi-host tests)."""

from __future__ import annotations

import socket

import psutil
import pytest

from runner.worker.network import NetworkError, choose_interface

pytestmark = pytest.mark.unit


def _an_address_of_this_machine() -> tuple[str, str]:
    for name, nics in psutil.net_if_addrs().items():
        for nic in nics:
            if nic.family == socket.AF_INET and not nic.address.startswith("127."):
                return name, nic.address
    pytest.fail("this machine has no non-loopback IPv4 address")


def test_the_interface_holding_the_route_to_the_master_is_chosen():
    name, addr = _an_address_of_this_machine()
    choice = choose_interface(addr, None, {}, {})
    assert choice.env == {"GLOO_SOCKET_IFNAME": name, "NCCL_SOCKET_IFNAME": name}
    assert f"{name} ({addr}) is the interface of the route to the master {addr}" in choice.note


def test_the_spec_and_the_users_environment_win():
    _, addr = _an_address_of_this_machine()
    spec = choose_interface(addr, "ib0", {}, {})
    assert spec.env == {"GLOO_SOCKET_IFNAME": "ib0", "NCCL_SOCKET_IFNAME": "ib0"} and "backend.socket_ifname" in spec.note
    users = choose_interface(addr, None, {"NCCL_SOCKET_IFNAME": "ib0"}, {"GLOO_SOCKET_IFNAME": "eth9"})
    assert users.env == {} and "set by the user" in users.note
    half = choose_interface(addr, None, {}, {"NCCL_SOCKET_IFNAME": "ib0"})
    assert set(half.env) == {"GLOO_SOCKET_IFNAME"} and "NCCL_SOCKET_IFNAME=ib0 (user's)" in half.note


def test_a_loopback_master_means_one_machine():
    assert choose_interface("127.0.0.1", None, {}, {}).env == {}


def test_a_master_name_that_does_not_resolve_is_a_clear_error():
    with pytest.raises(NetworkError, match=r"'no-such-host\.invalid' does not resolve .*hint: use an address"):
        choose_interface("no-such-host.invalid", None, {}, {})


def test_the_master_whose_own_name_is_loopback_there_takes_the_route_to_a_peer():
    """On host 0 its own name may resolve to 127.0.1.1 (Debian's /etc/hosts); gloo would then listen on
    loopback only. The route to another host decides instead."""
    name, addr = _an_address_of_this_machine()
    choice = choose_interface("localhost", None, {}, {}, peers=["127.0.0.2", addr])
    assert choice.env == {"GLOO_SOCKET_IFNAME": name, "NCCL_SOCKET_IFNAME": name}
    assert f"route to host {addr} (the master localhost is this host, and resolves to loopback here)" in choice.note
