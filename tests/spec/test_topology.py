"""runner.spec.topology: the topology config resolved into Host records (resolve_hosts), and what a host name may be.
How validation reports these problems with the rest of a spec: test_validation.py."""

from __future__ import annotations

import pytest

from runner.spec.problems import Problem
from runner.spec.schema import HostConfig, TopologyConfig
from runner.spec.topology import Host, is_loopback, is_valid_host, resolve_hosts

pytestmark = pytest.mark.unit


def resolved(**topology) -> tuple[tuple[Host, ...], list[tuple[str, str]]]:
    """The hosts of ``TopologyConfig(**topology)`` and its problems as (key, message)."""
    problems: list[Problem] = []
    hosts = resolve_hosts(TopologyConfig(**topology), problems)
    return hosts, [(p.key, p.message) for p in problems]


def test_a_grid_is_that_many_unnamed_hosts_each_with_its_devices() -> None:
    hosts, problems = resolved(nodes=2, devices_per_node=3, hosts=None)
    assert problems == []
    assert hosts == (Host(0, None, None, 3, (0, 1, 2)), Host(1, None, None, 3, (0, 1, 2)))
    assert [(h.label, h.reach) for h in hosts] == [("node0", None), ("node1", None)]


def test_a_host_list_keeps_names_addresses_devices_and_gpus() -> None:
    hosts, problems = resolved(nodes=None, devices_per_node=2, hosts=[
        HostConfig(name="a", addr="10.0.0.1", devices=None, gpus=None),
        HostConfig(name="b", addr=None, devices=1, gpus=[3]),
        HostConfig(name=None, addr="fd00::2", devices=1, gpus=None)])
    assert problems == []
    assert hosts == (Host(0, "a", "10.0.0.1", 2, (0, 1)), Host(1, "b", None, 1, (3,)), Host(2, None, "fd00::2", 1, (0,)))
    assert [(h.label, h.reach) for h in hosts] == [("a", "10.0.0.1"), ("b", "b"), ("node2", "fd00::2")]


@pytest.mark.parametrize("topology, expected", [
    (dict(nodes=None, devices_per_node=2, hosts=None),
     [("topology.nodes", "not set: the topology needs either topology.hosts or both nodes and devices_per_node "
                         "(missing: nodes)")]),
    (dict(nodes=0, devices_per_node=0, hosts=None),
     [("topology.nodes", "must be at least 1, got 0"), ("topology.devices_per_node", "must be at least 1, got 0")]),
    (dict(nodes=None, devices_per_node=None, hosts=[]), [("topology.hosts", "is an empty list")]),
    (dict(nodes=3, devices_per_node=1, hosts=[HostConfig(name="a"), HostConfig(name="b")]),
     [("topology.nodes", "is 3 but topology.hosts lists 2 host(s)")]),
    (dict(nodes=None, devices_per_node=None, hosts=[HostConfig(name="a", devices=None)]),
     [("topology.hosts[0].devices", "not set and topology.devices_per_node is not set either")]),
    (dict(nodes=None, devices_per_node=None, hosts=[HostConfig(name="a", devices=0)]),
     [("topology.hosts[0].devices", "must be at least 1, got 0")]),
    (dict(nodes=None, devices_per_node=1, hosts=[HostConfig(name="a;reboot"), HostConfig(addr="a b")]),
     [("topology.hosts[0].name", "'a;reboot' is not a host name or IP address"),
      ("topology.hosts[1].addr", "'a b' is not a host name or IP address")]),
    (dict(nodes=None, devices_per_node=1, hosts=[HostConfig(name="a"), HostConfig(name="x", addr="a")]),
     [("topology.hosts[1]", "'a' is listed twice (also topology.hosts[0])")]),
    (dict(nodes=None, devices_per_node=None, hosts=[HostConfig(name="a", devices=2, gpus=[1])]),
     [("topology.hosts[0].gpus", "lists 1 GPU(s) [1] for 2 device(s)")]),
    (dict(nodes=None, devices_per_node=None, hosts=[HostConfig(name="a", devices=2, gpus=[-1, -1])]),
     [("topology.hosts[0].gpus", "has duplicates: [-1, -1]"), ("topology.hosts[0].gpus", "has negative indices: [-1, -1]")]),
], ids=["grid-half-set", "grid-empty", "no-hosts", "nodes-disagree", "devices-unset", "no-devices", "bad-names",
        "twice", "gpus-count", "gpus-values"])
def test_what_is_wrong_is_said_and_no_hosts_are_given(topology, expected) -> None:
    hosts, problems = resolved(**topology)
    assert (hosts, problems) == ((), expected)


@pytest.mark.parametrize("value, valid", [("node-1", True), ("gpu_a.cluster.example", True), ("10.0.0.1", True),
                                          ("fd00::1", True), ("a;reboot", False), ("a b", False), ("-a", False),
                                          ("$(x)", False), ("", False), ("a." * 127, False)])
def test_a_host_is_a_name_or_an_address_and_nothing_a_shell_reads(value, valid) -> None:
    assert is_valid_host(value) is valid


@pytest.mark.parametrize("value, loopback", [("localhost", True), ("LOCALHOST", True), ("127.0.0.2", True),
                                             ("::1", True), ("ip6-localhost", True), ("10.0.0.1", False),
                                             ("thishost", False), ("fd00::1", False)])
def test_loopback_by_name_or_literal(value, loopback) -> None:
    assert is_loopback(value) is loopback
