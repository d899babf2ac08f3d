"""runner.launchers.elastic.membership: which hosts the next attempt runs on once hosts are lost, and its spec (the launch
that does it: tests/e2e/test_lost_hosts.py)."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import make_spec
from runner.launchers.elastic.membership import CannotGoOn, GoesOn, Membership
from runner.plan.processes import RunPort, port_for
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
    assert again.init.master_port == port_for("r1", RunPort.ATTEMPTS + 3) != spec.init.master_port
    assert Membership.of(spec).spec(spec, attempt=0).init == spec.init  # the first: the pinned port


def test_a_lost_host_is_kept_and_taken_back_after_the_others_up_to_max_nodes() -> None:
    after = Membership.of(spec_of([A, B, C], [], 1)).after_loss({0})
    assert isinstance(after, GoesOn) and [h.name for h in after.membership.absent] == ["a"]
    assert after.membership.room == 1
    back = after.membership.after_return(["a", "x"], now=100.0)  # x was never lost: not taken
    assert [h.name for h in back.membership.hosts] == ["b", "c", "a"] and [h.name for h in back.back] == ["a"]
    assert (back.membership.absent, back.membership.room, back.membership.joined_at) == ((), 0, (("a", 100.0),))
    assert back.membership.returning(now=150.0, rejoin_after_s=60) == ()  # at its most hosts: none to try


def test_a_host_taken_back_is_tried_again_only_rejoin_after_s_after_that() -> None:
    """The flap rule (launcher.rejoin_after_s): lost, taken back at t=100, lost again at t=110: it may be tried again
    from t=160 on; a host never taken back at once."""
    one = Membership.of(spec_of([A, B, C], [], 1)).after_loss({2}).membership.after_return(["c"], now=100.0)
    again = one.membership.after_loss({2, 1}).membership
    assert {c.host.name: c.due for c in again.returning(now=110.0, rejoin_after_s=60)} == {"c": 160.0, "b": 110.0}



def test_a_host_that_flaps_three_times_is_taken_back_at_most_once_per_rejoin_after_s() -> None:
    """Host c lost at t=0, 10, 80 and answering again after each (the rounds try it whenever it is due, every 5 s):
    taken back at once the first time (t=5), then not before t=65 though it answers from t=15 (taken at 65), then not
    before t=125: three flaps, two joins 60 s apart, each join asked only where a round may take it."""
    rejoin_after_s, joins = 60.0, []
    m = Membership.of(spec_of([A, B, C], [], 1))
    for lost_at, up_at in ((0.0, 5.0), (10.0, 15.0), (80.0, 85.0)):
        m = m.after_loss({[h.name for h in m.hosts].index("c")}).membership
        for now in (up_at + 5.0 * k for k in range(20)):  # c answers from up_at on; the watch looks every 5 s
            if lost_at == 80.0 and now >= 120.0:
                break  # (the job ended at t=120)
            due = {c.host.name: c.due for c in m.returning(now=now, rejoin_after_s=rejoin_after_s)}
            if due["c"] <= now:
                m, joins = m.after_return(["c"], now=now).membership, [*joins, now]
                break
    assert joins == [5.0, 65.0]
    assert [h.name for h in m.hosts] == ["a", "b"] and [h.name for h in m.absent] == ["c"]
    assert {c.host.name: c.due for c in m.returning(now=120.0, rejoin_after_s=rejoin_after_s)} == {"c": 125.0}

def test_max_nodes_is_the_specs_hosts_unless_it_says_more_and_no_attempt_spec_carries_it() -> None:
    spec = spec_of([A, B], [], 1)
    assert Membership.of(spec).max_nodes == 2
    grown = dataclasses.replace(spec, topology=dataclasses.replace(spec.topology, max_nodes=3, spares=[S]))
    assert Membership.of(grown).max_nodes == 3
    assert Membership.of(grown).spec(grown, 1).topology.max_nodes is None  # the launching side alone decides


def test_a_spare_not_ready_at_the_start_is_tried_and_kept_ready_or_taken_in_where_there_is_room() -> None:
    """A spare that failed the check of the start (started late): tried while the job runs; where the job has its
    most hosts it is only kept ready once it answers (a later loss takes it), else it joins as a host."""
    full = Membership.of(spec_of([A, B], [S], 1)).with_unready(["s"])
    assert (full.spares, full.unready) == ((), (S,))
    assert [(c.host.name, c.joins) for c in full.returning(now=5.0, rejoin_after_s=60)] == [("s", False)]
    kept = full.with_spares_ready(["s"])
    assert (kept.spares, kept.unready, kept.returning(now=6.0, rejoin_after_s=60)) == ((S,), (), ())
    roomy = dataclasses.replace(full, max_nodes=3)  # topology.max_nodes=3: it grows the job
    assert [(c.host.name, c.joins) for c in roomy.returning(now=5.0, rejoin_after_s=60)] == [("s", True)]
    grown = roomy.after_return(["s"], now=7.0)
    assert ([h.name for h in grown.membership.hosts], grown.membership.unready) == (["a", "b", "s"], ())


def test_a_spare_kept_ready_grows_the_job_where_max_nodes_leaves_room() -> None:
    """topology.max_nodes=3 over two hosts and a spare ready at the start: the spare is tried (it answers at once)
    and taken in at the first checkpoint, as torchrun's --nnodes=2:3 takes a third node that is there."""
    spec = spec_of([A, B], [S], 1)
    roomy = Membership.of(dataclasses.replace(spec, topology=dataclasses.replace(spec.topology, max_nodes=3)))
    assert [(c.host.name, c.joins) for c in roomy.returning(now=5.0, rejoin_after_s=60)] == [("s", True)]
    grown = roomy.after_return(["s"], now=6.0).membership
    assert ([h.name for h in grown.hosts], grown.spares, grown.room) == (["a", "b", "s"], (), 0)
    assert Membership.of(spec).returning(now=5.0, rejoin_after_s=60) == ()  # no room: a spare waits for a loss


def test_a_host_that_arrived_is_taken_in_after_the_others_and_never_in_a_lost_hosts_place() -> None:
    """launcher=manual: a host the spec does not list, standing by in etcd, is known to the rounds only once a decision
    takes it in (Ended.arrivals): it waits as a spare not ready at the start does, so that a loss in the same decision
    takes a listed spare, not it, and the join puts it after the others."""
    x = HostConfig(name="x", addr="10.0.0.9", devices=2)
    spec = spec_of([A, B, C], [S], 1)
    roomy = Membership.of(dataclasses.replace(spec, topology=dataclasses.replace(spec.topology, max_nodes=5)))
    arrived = roomy.with_arrivals([x, A])  # (a host it knows is not added again)
    assert (arrived.unready, arrived.with_arrivals([x]).unready) == ((x,), (x,))
    lost = arrived.after_loss({1})
    assert isinstance(lost, GoesOn) and [h.name for h in lost.membership.hosts] == ["a", "c", "s"]
    grown = lost.membership.after_return(["x"], now=9.0)
    assert ([h.name for h in grown.membership.hosts], grown.back, grown.membership.unready) == (
        ["a", "c", "s", "x"], (x,), ())
