"""runner.launchers.manual.meeting: the hosts' meeting points as real TCP servers on loopback addresses of their own
(127.0.0.x, one port), real meetings in threads: who chairs, who is lost and how, the majority rule, a late-comer.
The meetings of real hosts after a real loss: tests/e2e/test_lost_hosts_manual.py."""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from runner.launchers.manual.meeting import (Call, Decision, MeetingPoint, Peer, Windows, ask, decide, meet, meeting_port,
                                             say_farewell)
from runner.plan.processes import port_for

pytestmark = pytest.mark.unit

QUICK = Windows(silent_s=1.0, come_s=5.0)


@pytest.fixture
def run_id() -> str:
    return f"m{uuid.uuid4().hex[:8]}"


@pytest.fixture
def points(run_id: str) -> Iterator[list[MeetingPoint]]:
    """Three hosts' points, a, b and c at 127.0.0.11..13 on one port (the kernel's choice of a free one for a)."""
    made: list[MeetingPoint] = []
    while len(made) < 3:  # another process may hold that port at b's or c's address: then all again, on another
        first = MeetingPoint(run_id, "a", "127.0.0.11", 0).start()
        made = [first]
        try:
            made += [MeetingPoint(run_id, label, f"127.0.0.{12 + i}", first.port).start() for i, label in enumerate("bc")]
        except OSError:
            for point in made:
                point.close()
            made = []
    yield made
    for point in made:
        point.close()


def peers_of(points: list[MeetingPoint]) -> list[Peer]:
    return [Peer(label, f"127.0.0.{11 + i}") for i, label in enumerate("abc")][:len(points)]


def test_the_port_is_the_run_ids_own_and_not_its_rendezvous() -> None:
    assert meeting_port("R1") == meeting_port("R1") != port_for("R1")
    assert meeting_port("R1") != meeting_port("R2")


def test_a_point_answers_its_run_only_and_a_closed_one_refuses(points, run_id) -> None:
    a = points[0]
    answer, why = ask("127.0.0.11", a.port, {"run": run_id, "op": "ping", "host": "b"})
    assert answer == {"host": "a", "decision": None} and why == ""
    assert ask("127.0.0.11", a.port, {"run": "another", "op": "ping", "host": "b"}) == (None, "refused")
    a.close()
    assert ask("127.0.0.11", a.port, {"run": run_id, "op": "ping", "host": "b"}) == (None, "refused")
    points.remove(a)


def test_a_point_that_accepts_and_never_answers_is_silent(run_id) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listening:  # the kernel accepts; nobody reads or answers
        answer, why = ask("127.0.0.1", listening.getsockname()[1], {"run": run_id, "op": "ping", "host": "a"})
    assert (answer, why) == (None, "silent")


def test_farewells_are_kept_by_the_peers_points(points) -> None:
    a, b, c = points
    say_farewell(a, peers_of(points))
    assert b.farewells == c.farewells == {"a"} and not a.farewells


def test_every_host_came_so_all_go_on_from_the_next_attempt_with_host_0_in_the_chair(points) -> None:
    peers = peers_of(points)
    with ThreadPoolExecutor(3) as pool:
        decisions = list(pool.map(lambda p: meet(p, peers, 4, QUICK), points))
    assert decisions[0] == decisions[1] == decisions[2]
    assert decisions[0] == Decision(meeting=4, attempt=5, went_on=("a", "b", "c"), lost={}, ended=None, chair="a")


def test_host_0_gone_the_next_chairs_and_host_0_is_lost_because_its_point_refuses(points) -> None:
    a, b, c = points
    a.close()
    points.remove(a)
    peers = [Peer("a", "127.0.0.11"), *peers_of([b, c, c])[1:]]
    with ThreadPoolExecutor(2) as pool:
        decisions = list(pool.map(lambda p: meet(p, peers, 0, QUICK), [b, c]))
    assert decisions[0] == decisions[1]
    assert (decisions[0].went_on, decisions[0].chair, decisions[0].attempt) == (("b", "c"), "b", 1)
    assert decisions[0].lost == {"a": "its `run` is gone (its meeting point refuses)"}


def test_a_host_alone_is_not_more_than_half_and_ends_while_a_late_comer_learns_it_was_left_out(points) -> None:
    a, b, c = points
    peers = peers_of(points)
    known = {"b": "no answer", "c": "no answer"}  # its watch found them lost: not waited for
    alone = meet(a, peers, 2, QUICK, known_lost=known)
    assert alone.went_on == () and alone.lost == known
    assert alone.ended == ("only 1 of the attempt's 3 hosts reached each other (a): not more than half, so the others "
                           "may go on without them")
    late = meet(b, peers, 2, QUICK)  # the decision is kept at a's point: b is not among those who went on
    assert late == alone and "b" not in late.went_on


def test_a_host_silent_for_the_window_is_lost_and_the_rest_go_on(points, run_id) -> None:
    a, b, _ = points
    with socket.create_server(("127.0.0.14", a.port)):  # a host that accepts and never answers
        peers = [*peers_of([a, b]), Peer("d", "127.0.0.14")]
        with ThreadPoolExecutor(2) as pool:
            decisions = list(pool.map(lambda p: meet(p, peers, 0, QUICK), [a, b]))
    assert decisions[0] == decisions[1] and decisions[0].went_on == ("a", "b")
    assert decisions[0].lost == {"d": "no answer for 1 s (its machine or its network is gone)"}


def test_the_majority_rule_and_its_tie_with_host_0() -> None:
    four = [Peer(x, x) for x in "abcd"]
    assert decide(four, {"a": 0.0, "c": 0.0}, {}, 0, "a").went_on == ("a", "c")  # half, with host 0
    cut = decide(four, {"b": 0.0, "d": 0.0}, {"a": "gone", "c": "gone"}, 0, "b")  # half, without it: the other half
    assert cut.went_on == () and cut.ended is not None and cut.ended.startswith("only 2 of the attempt's 4 hosts")
    came_late = decide(four[:3], {"a": 0.0, "b": 0.0}, {"b": "no answer"}, 3, "a")  # came after all: not lost
    assert (came_late.went_on, came_late.lost, came_late.attempt) == (("a", "b"), {}, 4)


def test_a_decision_goes_through_its_document() -> None:
    decision = Decision(meeting=1, attempt=2, went_on=("a", "c"), lost={"b": "gone"}, chair="a")
    assert Decision.from_document(decision.document()) == decision
    assert Decision.from_document(None) is None and Decision.from_document({"meeting": "x"}) is None


def test_a_point_serves_its_callers_at_once(points, run_id) -> None:
    """Many hosts' questions at the same moment (a thread each): every one answered."""
    a = points[0]
    answers: list[object] = []
    lock = threading.Lock()

    def one() -> None:
        got, _ = ask("127.0.0.11", a.port, {"run": run_id, "op": "ping", "host": "x"})
        with lock:
            answers.append(got)

    threads = [threading.Thread(target=one) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == [{"host": "a", "decision": None}] * 16


def test_the_chair_calls_the_first_spares_that_answer_in_the_lost_hosts_places(points, run_id) -> None:
    """c lost; spare s1 gone (nothing listens), s2 answers: s2 is called in, s1 dropped, s3 still kept ready."""
    a, b, c = points
    c.close()
    points.remove(c)
    s2 = MeetingPoint(run_id, "s2", "127.0.0.15", a.port).start()
    s3 = MeetingPoint(run_id, "s3", "127.0.0.16", a.port).start()
    try:
        peers = [*peers_of([a, b]), Peer("c", "127.0.0.13")]
        spares = [Peer("s1", "127.0.0.14"), Peer("s2", "127.0.0.15"), Peer("s3", "127.0.0.16")]
        with ThreadPoolExecutor(2) as pool:
            decisions = list(pool.map(lambda p: meet(p, peers, 1, QUICK, spares=spares), [a, b]))
        assert s2.woken.is_set() and not s3.woken.is_set() and s3.call is None
    finally:
        s2.close()
        s3.close()
    assert decisions[0] == decisions[1]  # b heard the same from the chair, spares and all
    assert (decisions[0].went_on, decisions[0].spares_taken) == (("a", "b"), ("s2",))
    assert decisions[0].spares_gone == {"s1": "its `run` is gone (its meeting point refuses)"}
    assert s2.call == Call(attempt=2, hosts=("a", "b", "s2"), spares=("s3",))


def test_no_spare_is_called_when_nobody_was_lost(points) -> None:
    peers = peers_of(points)
    with ThreadPoolExecutor(3) as pool:
        decisions = list(pool.map(lambda p: meet(p, peers, 0, QUICK, spares=[Peer("s1", "127.0.0.14")]), points))
    assert decisions[0].spares_taken == () and decisions[0].spares_gone == {}


def test_the_chair_leaves_only_once_everyone_who_came_has_heard_the_decision(points) -> None:
    """The job may end at the chair (too few hosts left): its `run` and point go at once after its meeting, and the
    others must have the decision by then, not meet again without it."""
    a, b, c = points
    peers = peers_of(points)

    def chair_then_gone(point: MeetingPoint) -> Decision:
        decision = meet(point, peers, 0, QUICK)
        point.close()
        return decision

    with ThreadPoolExecutor(3) as pool:
        chaired = pool.submit(chair_then_gone, a)
        others = [pool.submit(meet, p, peers, 0, QUICK) for p in (b, c)]
        decisions = [chaired.result(), *(f.result() for f in others)]
    points.remove(a)
    assert decisions[0] == decisions[1] == decisions[2] and decisions[0].chair == "a", decisions
    assert a.told(0) == {"b", "c"}
