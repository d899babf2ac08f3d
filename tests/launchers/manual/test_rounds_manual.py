"""runner.launchers.manual.rounds without processes: what a meeting's decision makes of this host's round (the same
hosts again, a round ended with hosts lost, the job ended here), the meeting's windows, and a spare standing by. Real rounds on namespace
hosts: tests/e2e/test_lost_hosts_manual.py."""

from __future__ import annotations

import signal
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import environment, hosts_override, validate
from runner.common import exits
from runner.launchers import plan_for
from runner.launchers.manual import ManualLauncher
from runner.launchers.manual.meeting import Call, Decision, MeetingPoint, Peer, ask, say_farewell
from runner.launchers.manual.rounds import NotCalled, Round, _ended_by, run_round, stand_by
from runner.records.paths import RunPaths
from runner.spec.pins import pinned
from runner.worker.attempt_state import FAILURE_STOP_S, HARD_STOP_MARGIN_S
from runner.worker.host_agent import ENDINGS_WAIT_S

pytestmark = pytest.mark.unit

HOSTS = hosts_override(*({"name": n, "devices": 1} for n in ("a", "b", "c")))


@pytest.fixture
def round_of_b() -> Iterator[Round]:
    """Host b's first round of a three-host job with topology.min_nodes=2."""
    paths = RunPaths(Path("/runs/R1"), "R1")
    got = validate(("launcher=manual", "device=cpu", "init=tcp", "recipe.global_batch_size=6", "topology.min_nodes=2",
                    "launcher.max_restarts=2", "launcher.grace_s=3", "launcher.manual.keepalive_s=1", *HOSTS))
    assert got.valid, got.rendered()
    job = pinned(got.job, ManualLauncher.pins(got.job, paths))
    point = MeetingPoint(f"r{uuid.uuid4().hex[:6]}", "b", "127.0.0.41", 0).start()
    yield Round(plan=plan_for(job, paths), paths=paths, environment=environment(), point=point,
                zygote=None, node=1, first=True)  # type: ignore[arg-type]  (no share runs here)
    point.close()


def test_the_peers_are_the_rounds_hosts_and_the_windows_its_keepalive_and_ending_time(round_of_b) -> None:
    assert round_of_b.peers == [Peer("a", "a"), Peer("b", "b"), Peer("c", "c")]
    windows = round_of_b.windows()
    assert windows.silent_s == 4  # four keepalive intervals of 1 s
    assert windows.come_s == 3 + FAILURE_STOP_S + HARD_STOP_MARGIN_S + ENDINGS_WAIT_S + 30


def test_everyone_came_so_the_same_hosts_go_on(round_of_b) -> None:
    assert _ended_by(round_of_b, Decision(meeting=0, attempt=1, went_on=("a", "b", "c"), chair="a"), None) is None


def test_a_host_lost_ends_the_round_with_its_index_why_and_the_agreed_attempt(round_of_b) -> None:
    decision = Decision(meeting=1, attempt=2, went_on=("b", "c"), lost={"a": "its `run` is gone"}, chair="b")
    ended = _ended_by(round_of_b, decision, 1234.5)
    assert ended is not None
    assert (ended.code, ended.signalled, ended.lost, ended.why_lost, ended.next_attempt, ended.lost_at) == (
        exits.FAILED, None, frozenset({0}), {0: "its `run` is gone"}, 2, 1234.5)
    assert ended.cause == "host 0 (a) lost: its `run` is gone"


def test_the_job_ends_here_when_the_group_is_too_small_or_this_host_came_late(round_of_b, capsys) -> None:
    small = Decision(meeting=0, attempt=1, went_on=(), ended="only 1 of the attempt's 3 hosts reached each other",
                     chair="b")
    ended = _ended_by(round_of_b, small, None)
    assert ended is not None and (ended.code, ended.lost, ended.cause) == (exits.FAILED, frozenset(), small.ended)
    late = _ended_by(round_of_b, Decision(meeting=0, attempt=1, went_on=("a", "c"), chair="a"), None)
    assert late is not None and late.lost == frozenset() and late.cause == (
        "the other hosts went on without this one (a, c, from attempt 2): it came to the meeting too late")
    said = capsys.readouterr().err
    assert "manual: the job ends on this host: only 1 of the attempt's 3 hosts" in said
    assert "manual: the job ends on this host: the other hosts went on without this one" in said


def test_a_spare_stands_by_until_called_or_until_a_host_says_farewell(run_id_point) -> None:
    spare, host = run_id_point
    peers = [Peer("h", "127.0.0.42")]
    timer = threading.Timer(0.3, lambda: ask("127.0.0.43", spare.port, {
        "run": spare.run_id, "op": "call", "host": "h", "call": {"attempt": 1, "hosts": ["h", "s"], "spares": []}}))
    timer.start()
    assert stand_by(spare, peers, 0.1, 5.0, 5.0, []) == Call(attempt=1, hosts=("h", "s"), spares=())
    timer.join()


def test_a_spare_not_called_ends_when_the_job_is_over_or_its_hosts_are_gone(run_id_point) -> None:
    spare, host = run_id_point
    peers = [Peer("h", "127.0.0.42")]
    say_farewell(host, [Peer("s", "127.0.0.43")])
    done = stand_by(spare, peers, 0.1, 5.0, 5.0, [])
    assert done == NotCalled("the job ended without calling this spare (h said farewell)", job_done=True)
    spare.woken.clear()
    spare.farewells.clear()
    host.close()  # heard never (its point is gone): the start's wait applies
    gone = stand_by(spare, peers, 0.1, 5.0, 0.5, [])
    assert gone == NotCalled("no host of the job answered within 0.5 s of this spare's start (init.timeout_s)",
                             job_done=False)
    stopped = stand_by(spare, peers, 0.1, 5.0, 60.0, [signal.SIGTERM])  # `run` got SIGTERM while it stood by
    assert stopped == NotCalled("SIGTERM: this spare stops standing by", job_done=False)


@pytest.fixture
def run_id_point() -> Iterator[tuple[MeetingPoint, MeetingPoint]]:
    """A spare's point (s, 127.0.0.43) and a host's (h, 127.0.0.42), one run."""
    run_id = f"s{uuid.uuid4().hex[:6]}"
    host = MeetingPoint(run_id, "h", "127.0.0.42", 0).start()
    spare = MeetingPoint(run_id, "s", "127.0.0.43", host.port).start()
    yield spare, host
    for point in (spare, host):
        try:
            point.close()
        except OSError:
            pass


def test_a_signal_between_two_shares_ends_the_round_before_the_next_share(round_of_b) -> None:
    """SIGTERM reached `run` after the meeting, before the next share's agent handles signals: no share starts."""
    round_of_b.stopped.append(signal.SIGTERM)
    ended = run_round(round_of_b, None)
    assert (ended.code, ended.signalled, ended.lost) == (exits.from_signal(signal.SIGTERM), signal.SIGTERM, frozenset())
