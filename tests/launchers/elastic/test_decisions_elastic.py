"""runner.launchers.elastic.decisions: the hosts' decisions in a real etcd (tests/etcd_fixtures.py), each host a
Decider of its own in this process: one decision per attempt whoever races for it, the hosts that came going on with
the spares alive in the lost hosts' places, a host that left or whose lease expired lost, too few hosts ending the
job, a launch of its own for every relaunch."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest

from etcd_fixtures import local_etcd
from runner.launchers.elastic.decisions import AlreadyRunning, Decider, Decision, Joining, came_or_lost, decide
from runner.launchers.elastic.etcd import Etcd, EtcdError
from runner.launchers.elastic.launch_keys import Keys
from runner.launchers.elastic.membership import Membership
from runner.spec.schema import HostConfig
from runs import wait_until


def membership(hosts: str, spares: str = "", min_nodes: int = 2) -> Membership:
    return Membership(tuple(HostConfig(name=h) for h in hosts), tuple(HostConfig(name=s) for s in spares), min_nodes)


@pytest.mark.unit
def test_the_decision_is_the_rounds_model_with_the_spares_that_are_up() -> None:
    m = membership("abc", "st")
    assert decide(m, 0, ["a", "b", "c"], {}, set("abcst"), "a") == Decision(
        attempt=1, hosts=("a", "b", "c"), spares=("s", "t"), by="a")
    took = decide(m, 2, ["a", "c"], {"b": "gone"}, {"a", "c", "t"}, "c")  # spare s is down: t takes b's place
    assert (took.attempt, took.hosts, took.taken, took.spares, took.spares_gone, took.lost) == (
        3, ("a", "c", "t"), ("t",), (), ("s",), {"b": "gone"})
    ended = decide(membership("abc"), 0, ["a"], {"b": "gone", "c": "gone"}, {"a"}, "a")
    assert ended.hosts == () and ended.ended.startswith("1 host(s) left of 3, fewer than topology.min_nodes=2")
    assert Decision.of(took.document()) == took


@pytest.mark.unit
def test_hosts_joining_come_after_the_others_and_those_that_are_not_up_are_passed_over() -> None:
    """c came back and spare s stands by, both asked at the checkpoint: after a and b, in the order asked (as
    Membership.after_return puts them on every host); d, asked but gone meanwhile, is not taken; with b lost at the
    same time, t takes its place first."""
    m = membership("ab", "st")
    asked = Joining(("c", "s", "d"), 100.0)
    got = decide(m, 3, ["a", "b"], {}, set("abcst"), "a", asked)
    assert (got.attempt, got.hosts, got.spares, got.joined, got.joined_at) == (4, ("a", "b", "c", "s"), ("t",),
                                                                              ("c", "s"), 100.0)
    assert Decision.of(got.document()) == got and Joining.of(asked.document()) == asked
    both = decide(m, 3, ["a"], {"b": "gone"}, set("act"), "a", Joining(("c",), 100.0))  # s is down: t takes b's place
    assert (both.hosts, both.taken, both.joined, both.spares_gone) == (("a", "t", "c"), ("t",), ("c",), ("s",))
    assert decide(m, 3, ["a", "b"], {}, set("ab"), "a", Joining(("c",), 1.0)).joined == ()  # c gone again


class _Silent:
    """An etcd that does not answer keepalives while ``silent``, and then says the lease has ``left`` seconds."""

    def __init__(self) -> None:
        self.silent, self.left = True, 4

    def keepalive(self, lease: int) -> int:
        if self.silent:
            raise EtcdError("timed out")
        return self.left


@pytest.mark.unit
def test_etcd_silent_for_the_leases_time_puts_a_host_out_until_it_answers_with_the_lease_alive() -> None:
    """Silence is not final (an election under load): the host is out while etcd is silent for the lease's time (its
    share ends: it cannot know whether the others went on), and in again where etcd answers with its lease alive; what
    etcd decided then says whether it takes part. Only an expired lease is final."""
    etcd = _Silent()
    decider = Decider(etcd, "r1", "b", "host", every_s=1.0)  # type: ignore[arg-type]
    decider.lease = 7
    assert decider.beat() == (None, False)  # silent, but not for the lease's time yet
    decider.reached -= decider.ttl_s
    why, final = decider.beat()
    assert why == f"the job's etcd has not answered this host for {decider.ttl_s} s (timed out)" and not final
    decider.out = why
    assert decider.beat() == (why, False)  # still silent: still out
    etcd.silent = False
    assert decider.beat() == (None, False)  # it answered, the lease alive: in again


class _CutOff:
    """An etcd this host cannot reach for its first ``silent`` requests; then it holds the others' ``decision``."""

    def __init__(self, silent: int, decision: tuple[str, str]) -> None:
        self.silent, self.decision, self.asked = silent, decision, 0

    def _ask(self) -> None:
        self.asked += 1
        if self.asked <= self.silent:
            raise EtcdError("Network is unreachable")

    def put(self, key: str, value: str, lease: int | None = None) -> None:
        self._ask()

    def get(self, key: str) -> str | None:
        self._ask()
        return self.decision[1] if key == self.decision[0] else None


def test_a_host_cut_off_when_its_attempt_ended_learns_the_decision_if_etcd_answers_within_the_come_window() -> None:
    """c's link down while the others decided without it, and up again: c keeps asking for as long as it is told
    (its patience: the others' time to find it lost and end their shares), so it learns the decision (and that it
    is left out) instead of ending on an etcd it could not reach; where etcd stays silent for that long, it ends."""
    keys = Keys("r1", 0)
    made = Decision(attempt=1, hosts=("a", "b"), lost={"c": "gone"}, by="a")
    cut = Decider(_CutOff(silent=2, decision=(keys.attempt(1), made.document())), "r1", "c", "host",  # type: ignore[arg-type]
                  every_s=1.0)
    cut.keys = keys
    cut.reached -= 60  # (silent since before the attempt ended)
    assert cut.next_attempt(membership("abc"), 0, 30, lambda: False, patience_s=30) == made
    never = Decider(_CutOff(silent=10**6, decision=("", "")), "r1", "c", "host", every_s=1.0)  # type: ignore[arg-type]
    never.keys = keys
    with pytest.raises(EtcdError, match="Network is unreachable"):
        never.next_attempt(membership("abc"), 0, 30, lambda: False, patience_s=0.5)
    assert never.etcd.asked >= 2  # (asked again within the window)



@pytest.mark.unit
def test_the_hosts_that_came_and_why_each_other_host_is_lost() -> None:
    ended = {"a": {"how": "failed"}, "b": {"how": "leaving", "why": ""}, "c": {"how": "left out", "why": "the check"},
             "f": {"how": "joining"}}
    came, lost = came_or_lost(("a", "b", "c", "d", "e", "f"), ended, {"a", "b", "c", "e", "f"}, 2, 3, 30)
    assert came == ["a", "f"]
    assert lost == {"b": "it left: SIGTERM to its run", "c": "left out: the check",
                    "d": "its lease in the job's etcd expired (3 s without a keepalive): its `run`, its machine or its "
                         "network is gone",
                    "e": "it did not end attempt 3 within 30 s of this host"}

@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with local_etcd() as found:
        yield found


def hosts(endpoint: str, run_id: str, labels: str, spares: str = "") -> dict[str, Decider]:
    """A Decider each, joined (tests leave them with :func:`leave`: every lease revoked)."""
    found = {}
    for label in labels + spares:
        found[label] = Decider(Etcd([endpoint]), run_id, label, "spare" if label in spares else "host", every_s=0.5)
        found[label].join()
    return found


def leave(deciders: dict[str, Decider]) -> None:
    for d in deciders.values():
        d.leave()


def test_every_host_follows_the_one_decision_whoever_makes_it(endpoint) -> None:
    """a and b ended attempt 0 and race to decide; c's lease is gone (its `run` ended without a word): both get the
    one decision, without c, spare s in its place."""
    run_id = f"d{uuid.uuid4().hex[:6]}"
    d = hosts(endpoint, run_id, "abc", "s")
    d["c"].leave()
    for h in "ab":
        d[h].say_ended(0, "failed")
    got: dict[str, Decision] = {}
    racing = [threading.Thread(target=lambda h=h: got.update({h: d[h].next_attempt(membership("abc", "s"), 0, 30,
                                                                                    lambda: False)})) for h in "ab"]
    for t in racing:
        t.start()
    for t in racing:
        t.join()
    assert got["a"] == got["b"] and got["a"].hosts == ("a", "b", "s") and got["a"].taken == ("s",)
    assert "lease in the job's etcd expired" in got["a"].lost["c"]
    assert d["s"].decisions() == [got["a"]] and d["a"].decision(1) == got["a"]
    leave(d)


def test_a_host_that_is_up_but_has_not_ended_its_share_is_waited_for_then_lost(endpoint) -> None:
    run_id = f"w{uuid.uuid4().hex[:6]}"
    d = hosts(endpoint, run_id, "abc")
    d["a"].say_ended(0, "failed")
    d["c"].say_ended(0, "leaving", "SIGTERM to its run")
    made = d["a"].next_attempt(membership("abc"), 0, 1.0, lambda: False)  # b stays up, silent: lost after 1 s
    assert made.hosts == () and made.ended is not None  # 1 of 3 left: the job ends
    assert made.lost == {"b": "it did not end attempt 1 within 1 s of this host", "c": "it left: SIGTERM to its run"}
    assert d["b"].members.leaving(0) == {"c"}
    leave(d)


def test_a_host_that_arrives_is_found_in_etcd_as_its_key_says_and_taken_in_as_a_host(endpoint) -> None:
    """x, which the spec does not list, stands by with its name, address and devices in its member key: every host
    finds it there (Decider.arrivals), and the decision that takes it in keeps them in its key, now a host's; the
    listed hosts' keys carry none; a host left out of the check is 'left out' of leaving(), with why."""
    run_id = f"x{uuid.uuid4().hex[:6]}"
    d = hosts(endpoint, run_id, "ab")
    x = Decider(Etcd([endpoint]), run_id, "x", "spare", every_s=0.5,
                arrives=HostConfig(name="x", addr="10.0.0.9", devices=2))
    x.join()
    assert d["a"].members.arrivals() == {"x": HostConfig(name="x", addr="10.0.0.9", devices=2)} and "x" in d["a"].members.standing_by()
    d["a"].say_joining(0, Joining(("x",), 5.0))
    d["b"].say_ended(0, "left out", "host 1 (b) failed the data-network check before attempt 1 (...)")
    made = d["a"].next_attempt(membership("ab", min_nodes=1), 0, 30, lambda: False, how="joining")
    assert (made.hosts, made.joined) == (("a", "x"), ("x",)), made
    assert made.lost == {"b": "left out: host 1 (b) failed the data-network check before attempt 1 (...)"}
    assert d["a"].members.leavers(0) == {"b": ("left out", "host 1 (b) failed the data-network check before attempt 1 (...)")}
    assert d["a"].members.arrivals() == {"x": HostConfig(name="x", addr="10.0.0.9", devices=2)}  # (its key a host's now)
    assert "x" in d["a"].members.alive() and "x" not in d["a"].members.standing_by()
    leave({**d, "x": x})


def test_a_stop_while_waiting_ends_the_wait_and_every_host_that_ended_it_restarts_together(endpoint) -> None:
    run_id = f"s{uuid.uuid4().hex[:6]}"
    d = hosts(endpoint, run_id, "ab")
    d["a"].say_ended(0, "failed")
    assert d["a"].next_attempt(membership("ab"), 0, 30, lambda: True) is None
    d["b"].say_ended(0, "failed")
    assert d["a"].next_attempt(membership("ab"), 0, 30, lambda: False).hosts == ("a", "b")
    leave(d)


def test_a_host_whose_lease_expired_learns_it_is_out(endpoint) -> None:
    """b's keepalives stopped (a frozen `run`) until its lease expired: its next keepalive says it is out, for good."""
    run_id = f"o{uuid.uuid4().hex[:6]}"
    d = hosts(endpoint, run_id, "ab")
    b = d["b"]
    b._stop.set()
    b._beating.join()
    wait_until(lambda: d["a"].members.alive() == {"a"}, 10, "b's key gone with its lease")
    why, final = b.beat()
    assert why == f"this host's lease in the job's etcd expired ({b.ttl_s} s without a keepalive)" and final
    leave(d)


def test_a_host_left_out_comes_back_as_returning_with_a_lease_of_its_own_kept_alive(endpoint) -> None:
    """b's keepalives stopped until its lease expired (a host cut off, left out by the others): it comes back as a
    host returning, its key put again with a new lease that its keepalives renew, and stands by: not alive as a host
    of the attempt that runs. Where a second `run` of b holds b's key meanwhile, b cannot come back."""
    run_id = f"c{uuid.uuid4().hex[:6]}"
    d = hosts(endpoint, run_id, "ab")
    a, b = d["a"], d["b"]
    b._stop.set()
    b._beating.join()
    wait_until(lambda: a.members.alive() == {"a"}, 10, "b's key gone with its lease")
    old = b.lease
    b.come_back()
    assert (b.role, b.out) == ("returning", None) and b.lease != old
    assert a.members.alive() == {"a"} and a.members.standing_by() == {"b"}
    first = b.kept_until
    wait_until(lambda: b.kept_until > first, 10, "a keepalive of b's new lease")
    assert a.members.standing_by() == {"b"} and b.out is None
    b._stop.set()
    b._beating.join()
    b.etcd.revoke(b.lease)
    again = Decider(Etcd([endpoint]), run_id, "b", "host", every_s=0.5)  # a `run` of b typed again meanwhile
    again.keys, again.lease = b.keys, again.etcd.grant(again.ttl_s)
    again._claim(b.keys.member("b"), again._member_value())
    again._keep_alive()
    with pytest.raises(AlreadyRunning):
        b.come_back()
    leave({**d, "again": again})


def test_a_lease_etcd_revoked_though_its_host_kept_it_alive_is_put_back(endpoint, capfd) -> None:
    """etcd-io/etcd#15247: a member that led etcd and was paused revokes every lease when it wakes (by its own clock
    they all expired). b's lease revoked so, b kept it alive: at its next keepalive its key is back, with a new lease,
    and it is not out; it says so."""
    run_id = f"k{uuid.uuid4().hex[:6]}"
    d = hosts(endpoint, run_id, "ab")
    b = d["b"]
    old = b.lease
    d["a"].etcd.revoke(old)
    assert d["a"].members.alive() == {"a"}
    said = ("manual: etcd revoked this host's lease though it was kept alive (a member that led etcd and was paused "
            "revokes every lease when it wakes: etcd-io/etcd#15247); its key is back with a new lease")
    err: list[str] = []
    # (b puts its key, then takes the new lease as its own, then says so: the saying is the event to wait for)
    wait_until(lambda: err.append(capfd.readouterr().err) or said in "".join(err), 10, "b says its key is back")
    assert d["a"].members.alive() == {"a", "b"} and b.lease != old and b.out is None
    leave(d)


def test_a_relaunch_after_the_job_ended_or_every_host_left_is_a_launch_of_its_own(endpoint) -> None:
    run_id = f"r{uuid.uuid4().hex[:6]}"
    first = hosts(endpoint, run_id, "ab")
    assert {d.keys.launch for d in first.values()} == {0}
    first["a"].say_over("done")
    for d in first.values():
        d.leave()
    again = hosts(endpoint, run_id, "ab")
    assert {d.keys.launch for d in again.values()} == {1}  # launch 0 is over
    for d in again.values():
        d.leave()  # gone without a word (killed): launch 1 has no host left
    third = hosts(endpoint, run_id, "a")
    assert third["a"].keys.launch == 2
    third["a"].leave()


def test_a_join_is_asked_once_and_never_after_the_job_is_over_and_a_host_back_is_not_alive_as_a_host(endpoint) -> None:
    """Host 0 asks for c's join at attempt 1's checkpoint (once: a second ask gets the first); b's share that ended
    done meanwhile cannot say the job is over (the join came first), and the decision takes c in; c, standing by as
    ``returning``, is no host of the attempt (the lease watch finds it lost); a job over refuses a join."""
    run_id = f"j{uuid.uuid4().hex[:6]}"
    d = hosts(endpoint, run_id, "abc")
    for h in "abc":
        d[h].say_began(0)
    assert d["c"].has_begun()
    d["c"].become("returning")
    assert (d["a"].members.alive(), d["a"].members.returning(), d["a"].members.standing_by()) == ({"a", "b"}, {"c"}, {"c"})
    first = d["a"].say_joining(1, Joining(("c",), 5.0))
    assert first == Joining(("c",), 5.0) and d["b"].say_joining(1, Joining(("x",), 6.0)) == first
    assert d["b"].say_over("done", 1) is False and d["b"].is_over() is None
    for h in "ab":
        d[h].say_ended(1, "joining")
    made = d["a"].next_attempt(membership("ab"), 1, 30, lambda: False)
    assert (made.hosts, made.joined, made.joined_at) == (("a", "b", "c"), ("c",), 5.0)
    assert (d["a"].members.alive(), d["a"].members.returning()) == ({"a", "b", "c"}, set())  # a host from the decision on
    assert d["a"].say_over("done", 2) is True and d["a"].say_joining(2, Joining(("c",), 7.0)) is None
    leave(d)


def test_a_second_run_of_a_host_in_the_job_is_refused_and_one_after_a_killed_run_waits_for_its_key(endpoint) -> None:
    """a's key kept alive: a second `run` of a is refused (it would take a's place in the job); a's keepalives stopped
    (its `run` killed: no revoke): the next `run` of a joins once the old lease expired."""
    run_id = f"x{uuid.uuid4().hex[:6]}"
    d = hosts(endpoint, run_id, "ab")
    second = Decider(Etcd([endpoint]), run_id, "a", "host", every_s=0.5)
    with pytest.raises(AlreadyRunning, match="a `run` of host a is in this job already"):
        second.join()
    d["a"]._stop.set()  # killed outright: its lease is left to expire
    d["a"]._beating.join()
    again = Decider(Etcd([endpoint]), run_id, "a", "host", every_s=0.5)
    assert again.join().root == d["b"].keys.root and "a" in d["b"].members.alive()
    d["a"] = again
    leave(d)
