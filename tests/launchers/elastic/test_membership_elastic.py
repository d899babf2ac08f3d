"""runner.launchers.elastic.membership: which hosts the next attempt runs on once hosts are lost, and its spec (the launch
that does it: tests/e2e/test_lost_hosts.py)."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import make_spec
from runner.launchers.elastic.membership import CannotGoOn, GoesOn, Membership
from runner.plan.processes import port_for
from runner.spec.schema import HostConfig, JobConfig

pytestmark = pytest.mark.unit

A, B, C, D = (HostConfig(name=n, addr=f"10.0.0.{i}", devices=2) for i, n in enumerate("abcd", start=1))
S = HostConfig(name="s", devices=2)


def spec_of(hosts: list[HostConfig], spares: list[HostConfig], min_nodes: int | None) -> JobConfig:
    spec = make_spec(devices=[2] * len(hosts), names=[h.name for h in hosts], launcher="ssh")
    topology = dataclasses.replace(spec.topology, hosts=hosts, spares=spares, min_nodes=min_nodes,
                                   hostfile="hosts.txt")
    return dataclasses.replace(spec, topology=topology, run_id="r1")


def test_the_first_attempt_runs_on_the_specs_hosts() -> None:
    first = Membership.of(spec_of([A, B, C], [S], 2))
    assert (first.hosts, first.spares, first.min_nodes, first.names) == ((A, B, C), (S,), 2, ("a", "b", "c"))
    assert Membership.of(spec_of([A, B], [], None)).min_nodes == 2


def test_a_lost_host_leaves_the_others_in_their_order_numbered_again() -> None:
    went = Membership((A, B, C), (), 2).after_loss([1])
    assert isinstance(went, GoesOn) and (went.membership.hosts, went.taken) == ((A, C), ())


def test_losing_host_0_makes_the_first_survivor_host_0() -> None:
    went = Membership((A, B, C), (), 2).after_loss([0])
    assert isinstance(went, GoesOn) and went.membership.hosts == (B, C)


def test_a_spare_takes_the_lost_hosts_place_at_the_end_and_is_kept_no_more() -> None:
    went = Membership((A, B, C), (S, D), 3).after_loss([0])
    assert isinstance(went, GoesOn)
    assert (went.membership.hosts, went.membership.spares, went.taken) == ((B, C, S), (D,), (S,))


def test_fewer_than_min_nodes_left_ends_the_job_with_the_count() -> None:
    assert Membership((A, B, C), (), 3).after_loss([2]) == \
        CannotGoOn("2 host(s) left of 3, fewer than topology.min_nodes=3 (no spare left)")
    assert Membership((A, B, C), (), 2).after_loss([0, 2]) == \
        CannotGoOn("1 host(s) left of 3, fewer than topology.min_nodes=2 (no spare left)")


def test_the_next_attempts_spec_has_its_hosts_and_a_port_of_its_own() -> None:
    spec = spec_of([A, B, C], [S], 2)
    went = Membership.of(spec).after_loss([0])
    assert isinstance(went, GoesOn)
    again = went.membership.spec(spec, attempt=3)
    assert again.topology.hosts == [B, C, S] and again.topology.spares == []
    assert (again.topology.hostfile, again.topology.nodes, again.topology.min_nodes) == (None, None, 2)
    assert again.init.master_port == port_for("r1.3") != spec.init.master_port
    assert Membership.of(spec).spec(spec, attempt=0).init == spec.init  # the first: the pinned port
