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


@pytest.fixture
def three(endpoint) -> Iterator[dict[str, Decider]]:
    run_id = f"w{uuid.uuid4().hex[:6]}"
    found = {h: Decider(Etcd([endpoint]), run_id, h, "host", every_s=0.2) for h in "abc"}
    for d in found.values():
        d.join()
    yield found
    for d in found.values():
        d.leave()


def watch_of(deciders: dict[str, Decider], lost: list) -> LeaseWatch:
    return LeaseWatch(deciders["a"], ["a", "b", "c"], 0, lambda h, why: lost.append((h, why)), lambda why: None)


def test_a_peer_whose_lease_is_gone_is_lost_once_with_why(three) -> None:
    lost: list = []
    watch = watch_of(three, lost)
    assert watch.look() is None and lost == []
    three["c"].leave()
    assert watch.look() is None and watch.look() is None
    assert lost == [("c", "its lease in the job's etcd expired (2 s without a keepalive): its `run`, its machine or "
                          "its network is gone")]


def test_a_decision_without_this_host_puts_it_out(three) -> None:
    watch = watch_of(three, [])
    three["b"].etcd.create(three["b"].keys.attempt(1), Decision(attempt=1, hosts=("b", "c"), by="b").document())
    assert watch.look() == "the other hosts went on to attempt 2 (b, c) without this host's share of attempt 1"


def test_this_hosts_lease_gone_puts_it_out(three) -> None:
    a = three["a"]
    a.etcd.revoke(a.lease)
    watch = watch_of(three, [])
    wait_until(lambda: watch.look() is not None, 10, "a's watch finding a out")
    assert watch.look().startswith("this host's lease in the job's etcd expired")


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
