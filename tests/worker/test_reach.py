"""``run --reach ADDR PORT NODE`` (runner.worker.reach), with real sockets on this machine: a name that does not
resolve, loopback, an address of this host's own (host 0: is the port free for the store; another host: it would
dial itself), a host that answers (refused or accepted) and one that stays silent. Every host's check asks it on the
test bed (tests/e2e/test_ssh.py: an unresolvable master refused in seconds)."""

from __future__ import annotations

import json
import socket
import subprocess

import psutil
import pytest

from runner.environments import versions
from runner.environments.versions import Versions
from runner.worker import reach as reach_module
from runner.worker.reach import Reached, reach
from runs import RUN



def own_address() -> str:
    """An IPv4 address of this machine that is not loopback."""
    for nics in psutil.net_if_addrs().values():
        for nic in nics:
            if nic.family == socket.AF_INET and not nic.address.startswith("127."):
                return nic.address
    pytest.fail("this machine has no IPv4 address but loopback")


@pytest.mark.unit
def test_a_name_that_does_not_resolve_is_said_with_the_fix() -> None:
    got = reach("no-such-host.invalid", 29500, 1)
    assert not got.ok and got.said.startswith("'no-such-host.invalid' does not resolve on this host (")
    assert "topology.hosts[0].addr=IP" in got.hint and "/etc/hosts" in got.hint


@pytest.mark.unit
def test_loopback_and_this_hosts_own_address_are_no_master_for_another_host() -> None:
    got = reach("127.0.0.1", 29500, 1)
    assert not got.ok and got.said == "127.0.0.1 is this host's loopback: it would dial itself"
    mine = own_address()
    got = reach(mine, 29500, 1)
    assert not got.ok and got.said == f"{mine} is an address of this very host, not host 0's"


@pytest.mark.unit
def test_host_0_checks_that_the_port_is_free_for_the_store() -> None:
    mine = own_address()
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        got = reach(mine, port, 0)
        assert not got.ok and got.said.startswith(f"port {port} is taken on host 0 (")
    free = reach(mine, port, 0)
    assert free.ok and free.said == f"{mine} is this host's; port {port} is free for the store"


@pytest.mark.unit
def test_a_host_that_answers_refused_or_accepted_is_reached_and_silence_is_not() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        fix = "fix"
        assert reach_module._answers("127.0.0.1", "127.0.0.1", port, 2.0, fix).ok  # something listens
    refused = reach_module._answers("127.0.0.1", "127.0.0.1", port, 2.0, fix)  # nothing listens: the kernel answers
    assert refused.ok and refused.said == f"127.0.0.1 answered on port {port} (nothing listens there yet)"
    # silence: a listener whose queue is full drops every further SYN, as a firewall that drops would
    with socket.socket() as full, socket.socket() as first:
        full.bind(("127.0.0.1", 0))
        full.listen(0)
        port = full.getsockname()[1]
        first.connect(("127.0.0.1", port))  # fills the queue (nobody accepts)
        silent = reach_module._answers("127.0.0.1", "127.0.0.1", port, 0.05, fix)
    assert not silent.ok and silent.said == f"127.0.0.1 gave no answer on port {port} within 0.05 s"
    assert silent.hint.startswith("a firewall between the hosts")


def test_run_reach_says_its_versions_then_answers_in_one_json_line_and_refuses_a_bad_command_line() -> None:
    """The versions line first, as `run --version` prints it (the ssh check reads both from this one command)."""
    done = subprocess.run([RUN, "--reach", "127.0.0.1", "29500", "1"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    said_versions, answer = done.stdout.splitlines()
    assert said_versions == versions.installed().line() and Versions.parse(done.stdout) == versions.installed()
    assert json.loads(answer) == {"reach": {"ok": False, "said": "127.0.0.1 is this host's loopback: it would "
                                                                "dial itself",
                                            "hint": reach("127.0.0.1", 1, 1).hint}}
    assert Reached.parse(done.stdout) == reach("127.0.0.1", 29500, 1)
    bad = subprocess.run([RUN, "--reach", "127.0.0.1"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("usage: run --reach <address> <port> <node rank>")
