"""runner.worker.pair_check: the rule that names a host (pure), a dial of a real listener on this machine, and every
host's part of the check run as threads of this process over one board (as host 0's store would hold it), with a
pair of hosts made unable to reach each other by an address that routes nowhere. The check between namespace hosts
whose data network is cut is in tests/e2e/test_lost_hosts_manual.py."""

from __future__ import annotations

import dataclasses
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from runner.worker.pair_check import Absent, Listener, PairBoard, Verdict, check_pairs, dial, verdict

pytestmark = pytest.mark.unit

NOWHERE = "192.0.2.1"  # TEST-NET-1 (RFC 5737): no host answers there
LOOK_S = 0.005  # the board is a dict in this process: asked again every 5 ms, not every 0.1 s as host 0's store


# --------------------------------------------------------------------------- the rule


def test_every_pair_answered_names_nobody():
    found = verdict(3, {0: {1: "", 2: ""}, 1: {0: "", 2: ""}, 2: {0: "", 1: ""}})
    assert found == Verdict(failed={}, named=None)


def test_the_host_in_most_failed_pairs_is_named():
    """Host 1's data interface down: its pairs with 0 and 2 fail, 0 and 2 reach each other."""
    found = verdict(3, {0: {1: "no answer", 2: ""}, 1: {0: "no answer", 2: "no answer"}, 2: {0: "", 1: "refused"}})
    assert found.named == 1
    assert set(found.failed) == {(0, 1), (1, 2)}
    assert found.failed[(1, 2)] == "1 -> 2: no answer, 2 -> 1: refused"
    backwards = {2: {1: "refused", 0: ""}, 1: {2: "no answer", 0: "no answer"}, 0: {2: "", 1: "no answer"}}
    assert verdict(3, backwards) == found  # whichever host said it first


def test_a_tie_goes_to_the_higher_node_rank_and_never_to_host_0_between_two():
    assert verdict(3, {1: {2: "no answer"}, 2: {1: ""}}).named == 2  # a cut between host 1 and host 2 only
    assert verdict(2, {0: {1: "no answer"}, 1: {0: "no answer"}}).named == 1


def test_one_direction_failing_fails_the_pair_and_a_silent_host_counts_for_nothing():
    """Host 2 said nothing (its dials unknown): only what hosts 0 and 1 found counts."""
    found = verdict(3, {0: {1: "", 2: ""}, 1: {0: "no answer", 2: ""}})
    assert (found.named, set(found.failed)) == (1, {(0, 1)})


def test_the_verdict_crosses_the_channel_as_json_and_says_which_host_and_why():
    found = verdict(3, {0: {1: "x", 2: ""}, 1: {0: "x", 2: "y"}, 2: {0: "", 1: ""}})
    assert Verdict.of(found.document()) == found
    assert Verdict.of({"nothing": 1}) is None and Verdict.of(None) is None
    assert found.why(["a", "b", "c"], attempt=1) == (
        "host 1 (b) failed the data-network check before attempt 2 (2 of the failed pair(s): host 0 (a) and "
        "host 1 (b): 0 -> 1: x, 1 -> 0: x; host 1 (b) and host 2 (c): 1 -> 2: y)")


# --------------------------------------------------------------------------- a dial


def test_a_dial_is_answered_by_the_host_it_asks_for_only():
    listener = Listener("127.0.0.1", "job/0", node=2)
    try:
        assert dial("127.0.0.1", listener.port, "job/0", node=0, peer=2, timeout_s=5) == ""
        assert "answered, but not as host 1" in dial("127.0.0.1", listener.port, "job/0", node=0, peer=1, timeout_s=5)
        assert dial("127.0.0.1", listener.port, "other/0", node=0, peer=2, timeout_s=5) != ""  # another job's (or
        # attempt's) dial: no answer
        with socket.create_connection(("127.0.0.1", listener.port), timeout=5) as short:  # a payload cut short
            short.sendall(b"runner-pair job/0 0 1000\n" + bytes(10))
            short.shutdown(socket.SHUT_WR)
            assert short.recv(64) == b""
        assert dial("127.0.0.1", listener.port, "job/0", node=1, peer=2, timeout_s=5, payload=3 << 20) == ""
    finally:
        listener.close()
    closed = dial("127.0.0.1", listener.port, "job/0", node=0, peer=2, timeout_s=5)
    assert closed.startswith(f"127.0.0.1:{listener.port}: ") and "efused" in closed, closed


def test_a_dial_that_nothing_answers_gives_up_after_its_time():
    said = dial(NOWHERE, 9, "job/0", node=0, peer=1, timeout_s=0.5)
    assert said == f"no answer from {NOWHERE}:9 within 0.5 s" or said.startswith(f"{NOWHERE}:9: "), said


# --------------------------------------------------------------------------- every host's part


class Board:
    """One dict as host 0's store. Each host's view of it (:meth:`of`) may see some hosts' addresses replaced by one
    that answers nothing: ``unreachable``, the hosts it cannot reach."""

    def __init__(self) -> None:
        self.values: dict[str, object] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def of(self, node: int, unreachable: set[int]) -> PairBoard:
        def get(key: str) -> object:
            with self.lock:
                value = self.values.get(key)
            peer = key.rsplit("/", 1)[-1]
            if "/at/" in key and value is not None and peer.isdigit() and int(peer) in unreachable:
                return [NOWHERE, 9]
            return value

        def put(key: str, value: object) -> None:
            with self.lock:
                self.values[key] = value

        return PairBoard(put=put, get=get, stopping=self.stop.is_set, look_s=LOOK_S)


def run_check(hosts: int, cut: dict[int, set[int]], board: Board | None = None,
              hung: tuple[int, str] | None = None) -> list[Verdict | Absent | None]:
    """Each host's part, ``hung`` host 0's (runner.worker.hung_hosts: the others have none)."""
    board = board or Board()
    with ThreadPoolExecutor(max_workers=hosts) as pool:
        parts = [pool.submit(check_pairs, board.of(h, cut.get(h, set())), 0, h, hosts, "127.0.0.1", "job/0",
                             timeout_s=0.3, gather_s=10.0, hung=hung if h == 0 else None) for h in range(hosts)]
        return [p.result(timeout=60) for p in parts]


def test_every_host_reads_the_verdict_host_0_made_and_all_passing_names_nobody():
    assert run_check(3, {}) == [Verdict(failed={}, named=None)] * 3


def test_a_host_that_hung_the_two_attempts_before_is_named_where_every_pair_answers():
    hung = (2, "hung the job in attempts 1 and 2: ...")
    assert run_check(3, {}, hung=hung) == [Verdict(failed={}, named=2, hung=hung[1])] * 3
    said = run_check(3, {}, hung=hung)[1]
    assert said is not None and said.why(["a", "b", "c"], attempt=2) == "host 2 (c) hung the job in attempts 1 and 2: ..."
    found = run_check(3, {0: {1}, 2: {1}}, hung=hung)  # a host the pairs name comes first: one host an attempt
    assert [(v.named, v.hung) if v else None for v in found] == [(1, "")] * 3, found
    named = Verdict(failed={}, named=2, hung=hung[1])
    assert Verdict.of(named.document()) == named and found[0] is not None and Verdict.of(found[0].document()) == found[0]


def test_a_cut_between_host_1_and_host_2_names_host_2_on_every_host():
    found = run_check(3, {1: {2}, 2: {1}})
    assert all(v is not None and v.named == 2 and set(v.failed) == {(1, 2)} for v in found), found
    assert found[0] == found[1] == found[2]


def test_a_host_unreachable_from_every_other_is_named():
    found = run_check(3, {0: {1}, 2: {1}})
    assert [v.named if v else None for v in found] == [1, 1, 1], found


def test_a_host_with_no_address_on_the_data_network_says_so_and_is_named_without_a_wait():
    """Host 1 found no address of its own (no route: NetworkError in its preparation): it says so instead of
    listening, dials nobody, and the others do not wait for it: it is in every failed pair."""
    board = Board()
    with ThreadPoolExecutor(max_workers=3) as pool:
        parts = [pool.submit(check_pairs, board.of(h, set()), 0, h, 3, None if h == 1 else "127.0.0.1", "job/0",
                             timeout_s=0.3, gather_s=10.0, no_addr="no route from this host to the master 10.9.9.9")
                 for h in range(3)]
        found = [p.result(timeout=30) for p in parts]
    assert [v.named if v else None for v in found] == [1, 1, 1], found
    assert found[0].failed[(0, 1)] == ("0 -> 1: host 1 has no address on the data network, 1 -> 0: no address on "
                                       "the data network: no route from this host to the master 10.9.9.9")


def test_a_host_that_never_says_where_it_listens_is_absent_after_the_wait():
    """Host 2 never comes: hosts 0 and 1 give up after ``gather_s`` (here on a clock of the test's: the wait passes
    without being waited) and say which host did not come (the ranks' rendezvous would wait as long again for it)."""
    now = [0.0]
    board = Board()

    def sleep(seconds: float) -> None:
        now[0] += seconds

    def view(node: int) -> PairBoard:
        return dataclasses.replace(board.of(node, set()), look_s=10.0, clock=lambda: now[0], sleep=sleep)

    board.values["0/at/1"] = ["127.0.0.1", 9]  # host 1 said where it listens; host 0 waits alone, then host 1
    assert check_pairs(view(0), 0, 0, 3, "127.0.0.1", "job/0", timeout_s=1.0, gather_s=600) == Absent((2,))
    assert now[0] == pytest.approx(600)
    assert check_pairs(view(1), 0, 1, 3, "127.0.0.1", "job/0", timeout_s=1.0, gather_s=600) == Absent((2,))
    assert now[0] == pytest.approx(1200)


def test_a_share_asked_to_stop_gives_up_the_wait_at_once():
    board = Board()
    board.stop.set()
    assert check_pairs(board.of(1, set()), 0, 1, 3, "127.0.0.1", "job/0", timeout_s=1.0, gather_s=600) is None


def test_the_listener_is_closed_when_the_check_ends():
    board = Board()
    assert run_check(2, {}, board) == [Verdict(failed={}, named=None)] * 2
    addr, port = board.values["0/at/1"]  # type: ignore[misc]
    with pytest.raises(OSError):
        socket.create_connection((addr, port), timeout=2).close()
