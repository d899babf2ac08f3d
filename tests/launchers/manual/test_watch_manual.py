"""runner.launchers.manual.watch: a host's watch of its peers' leases in a real etcd (tests/etcd_fixtures.py), one
look at a time: a peer whose lease is gone is lost once; this host is out where its own lease is gone or a decision
for the next attempt exists without it; nobody is lost once the job is over."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from etcd_fixtures import local_etcd
from runner.launchers.elastic.decisions import Decider, Decision
from runner.launchers.elastic.etcd import Etcd
from runner.launchers.manual.watch import LeaseWatch
from runs import wait_until


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with local_etcd() as found:
        yield found


def joined(endpoint: str, every_s: float) -> Iterator[dict[str, Decider]]:
    run_id = f"w{uuid.uuid4().hex[:6]}"
    found = {h: Decider(Etcd([endpoint]), run_id, h, "host", every_s=every_s) for h in "abc"}
    for d in found.values():
        d.join()
    yield found
    for d in found.values():
        d.leave()


@pytest.fixture
def three(endpoint) -> Iterator[dict[str, Decider]]:
    yield from joined(endpoint, every_s=0.2)


@pytest.fixture
def three_each_second(endpoint) -> Iterator[dict[str, Decider]]:
    """Keepalives every second: a key put back at the next one is back a second before its host would be lost."""
    yield from joined(endpoint, every_s=1.0)


def watch_of(deciders: dict[str, Decider], lost: list) -> LeaseWatch:
    return LeaseWatch(deciders["a"], ["a", "b", "c"], 0, lambda h, why: lost.append((h, why)), lambda why: None)


def test_a_peer_whose_key_stays_gone_is_lost_once_with_why(three) -> None:
    """c's key gone (its `run` ended without a word): not lost at the first look that finds it gone (a host whose
    kept lease etcd revoked puts its key back at its next keepalive), lost once it stays gone for two intervals, and
    said once."""
    lost: list = []
    watch = watch_of(three, lost)
    assert watch.look() is None and lost == []
    three["c"].leave()
    assert watch.look() is None and lost == []
    wait_until(lambda: watch.look() is None and lost, 10, "c lost")
    assert watch.look() is None and lost == [("c", "its lease in the job's etcd expired (2 s without a keepalive): "
                                                   "its `run`, its machine or its network is gone")]


def test_a_peer_whose_kept_lease_etcd_revoked_is_not_lost(three_each_second) -> None:
    """etcd-io/etcd#15247: a woken member that led etcd revokes leases their hosts kept alive. c's so: its key is
    back within its next keepalive, and the watch, looking every interval meanwhile, loses nobody."""
    three = three_each_second
    lost: list = []
    watch = watch_of(three, lost)
    c = three["c"]
    old = c.lease
    c.etcd.revoke(old)
    wait_until(lambda: watch.look() is None and c.lease != old and "c" in c.members.alive(), 10, "c's key back")
    assert watch.look() is None and lost == [] and watch.missing == {}  # (a look after it came back)


def test_a_decision_without_this_host_puts_it_out(three) -> None:
    watch = watch_of(three, [])
    three["b"].etcd.create(three["b"].keys.attempt(1), Decision(attempt=1, hosts=("b", "c"), by="b").document())
    assert watch.look() == "the other hosts went on to attempt 2 (b, c) without this host's share of attempt 1"


def test_this_hosts_lease_expired_puts_it_out(three) -> None:
    """a's keepalives stopped (a frozen `run`) until its lease expired: its keepalive says it is out, and so does its
    watch."""
    a = three["a"]
    a._stop.set()
    a._beating.join()
    wait_until(lambda: "a" not in three["b"].members.alive(), 10, "a's key gone with its lease")
    a.out, final = a.beat()
    assert final and watch_of(three, []).look() == "this host's lease in the job's etcd expired (2 s without a keepalive)"


def test_once_the_job_is_over_a_peer_that_goes_is_no_loss(three) -> None:
    lost: list = []
    watch = watch_of(three, lost)
    three["b"].say_over("done")
    three["b"].leave()
    assert watch.look() is None and lost == []


def test_the_watch_thread_says_a_loss_and_stops(three) -> None:
    lost: list = []
    watch = watch_of(three, lost).start()
    three["c"].leave()
    wait_until(lambda: lost, 10, "the watch saying c lost")
    watch.stop()
    assert [h for h, _ in lost] == ["c"]
