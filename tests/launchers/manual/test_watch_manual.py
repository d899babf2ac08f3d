"""runner.launchers.manual.watch: a host's watch of its peers' meeting points (real points on loopback addresses),
each waited for by its event with a deadline: a peer whose point goes is lost once, with how it went; one never seen
(not started yet) is not; one that said farewell is not."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from runner.launchers.manual.meeting import MeetingPoint, Peer, say_farewell
from runner.launchers.manual.watch import BEATS_MISSED, PeerWatch

pytestmark = pytest.mark.unit

EVERY_S = 0.1


class Heard:
    """What a watch said: each lost peer's label and why, and an event once one came."""

    def __init__(self) -> None:
        self.lost: list[tuple[str, str]] = []
        self.event = threading.Event()

    def __call__(self, label: str, why: str) -> None:
        self.lost.append((label, why))
        self.event.set()


@pytest.fixture
def pair() -> Iterator[tuple[MeetingPoint, MeetingPoint]]:
    run_id = f"w{uuid.uuid4().hex[:8]}"
    a = MeetingPoint(run_id, "a", "127.0.0.21", 0).start()
    b = MeetingPoint(run_id, "b", "127.0.0.22", a.port).start()
    yield a, b
    for point in (a, b):
        try:
            point.close()
        except OSError:
            pass


PEERS = [Peer("a", "127.0.0.21"), Peer("b", "127.0.0.22")]


def test_a_peer_whose_point_goes_is_lost_once_with_its_point_refusing(pair) -> None:
    a, b = pair
    heard = Heard()
    watch = PeerWatch(a, PEERS, EVERY_S, heard, seen=False).start()
    try:
        assert watch.silent_s == BEATS_MISSED * EVERY_S
        deadline = time.monotonic() + 10
        while "b" not in watch.heard:  # the watch hears b once: from then on b's silence counts
            assert time.monotonic() < deadline, "a never heard b"
            time.sleep(EVERY_S)
        b.close()
        assert heard.event.wait(10 * watch.silent_s), "b never found lost"
    finally:
        watch.stop()
    assert heard.lost == [("b", "its `run` is gone (its meeting point refuses)")]  # two refusals, not 4 intervals


def test_a_peer_never_seen_is_not_lost(pair) -> None:
    a, _ = pair
    heard = Heard()
    watch = PeerWatch(a, [*PEERS[:1], Peer("c", "127.0.0.23")], EVERY_S, heard, seen=False).start()  # c never started
    assert not heard.event.wait(3 * watch.silent_s)
    watch.stop()
    assert heard.lost == [] and "c" not in watch.heard


def test_a_peer_that_said_farewell_is_not_lost_when_its_point_goes(pair) -> None:
    a, b = pair
    heard = Heard()
    say_farewell(b, PEERS)  # b's share ended well: a's point has its farewell
    b.close()
    watch = PeerWatch(a, PEERS, EVERY_S, heard, seen=True).start()
    assert not heard.event.wait(3 * watch.silent_s)
    watch.stop()
    assert heard.lost == [] and a.farewells == {"b"}


def test_peers_taken_as_seen_are_lost_even_if_never_heard_and_a_silent_one_after_four_intervals(pair) -> None:
    a, _ = pair
    heard = Heard()
    with socket.create_server(("127.0.0.24", a.port)):  # d accepts and never answers: silent, not refusing
        peers = [*PEERS[:1], Peer("c", "127.0.0.23"), Peer("d", "127.0.0.24")]
        watch = PeerWatch(a, peers, EVERY_S, heard, seen=True).start()
        try:
            wait_for = time.monotonic() + 20 * watch.silent_s
            while len(heard.lost) < 2:
                assert heard.event.wait(max(0.0, wait_for - time.monotonic())), heard.lost
                heard.event.clear()
        finally:
            watch.stop()
    assert sorted(heard.lost) == [("c", "its `run` is gone (its meeting point refuses)"),
                                  ("d", "no answer for 0.4 s (launcher.manual.keepalive_s=0.1): its machine or "
                                        "network is gone")]
