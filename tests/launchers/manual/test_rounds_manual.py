"""runner.launchers.manual.rounds without shares: what a decision makes of this host's round (the same hosts again, a
round ended with hosts lost, the job ended here), the come window, a signal between two shares, and a spare standing
by in a real etcd (tests/etcd_fixtures.py) until a decision takes it in or the job is over. Real rounds on namespace
hosts: tests/e2e/test_lost_hosts_manual.py."""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import environment, hosts_override, validate
from etcd_fixtures import local_etcd
from runner.common import exits
from runner.launchers import plan_for
from runner.launchers.elastic.decisions import AlreadyRunning, Decider, Decision
from runner.launchers.elastic.etcd import Etcd, EtcdError
from runner.launchers.manual import ManualLauncher
from runner.launchers.manual.rounds import HostRound, NotCalled, _ended_by, come_back, run_round, stand_by
from runner.records.paths import RunPaths
from runner.spec.pins import pinned
from runner.worker.attempt_state import FAILURE_STOP_S, HARD_STOP_MARGIN_S
from runner.worker.attempt_report import ENDINGS_WAIT_S

HOSTS = hosts_override(*({"name": n, "devices": 1} for n in ("a", "b", "c")))


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with local_etcd() as found:
        yield found


def decider(endpoint: str, run_id: str, label: str, role: str = "host") -> Decider:
    found = Decider(Etcd([endpoint]), run_id, label, role, every_s=0.2)
    found.join()
    return found


@pytest.fixture
def round_of_b(endpoint) -> Iterator[HostRound]:
    """Host b's first round of a three-host job with topology.min_nodes=2."""
    paths = RunPaths(Path("/runs/R1"), "R1")
    got = validate(("launcher=manual", "device=cpu", "init=tcp", "recipe.global_batch_size=6", "topology.min_nodes=2",
                    "launcher.max_restarts=2", "launcher.grace_s=3", "launcher.manual.keepalive_s=1", *HOSTS))
    assert got.valid, got.rendered()
    job = pinned(got.job, ManualLauncher.pins(got.job, paths))
    b = decider(endpoint, f"r{uuid.uuid4().hex[:6]}", "b")
    yield HostRound(plan=plan_for(job, paths), paths=paths, environment=environment(), decider=b,
                    zygote=None, node=1, max_nodes=3)  # type: ignore[arg-type]  (no share runs here)
    b.leave()


def test_the_hosts_are_the_rounds_and_the_come_window_its_ending_time(round_of_b) -> None:
    assert round_of_b.hosts == ["a", "b", "c"] and round_of_b.membership.names == ("a", "b", "c")
    assert round_of_b.come_s() == 3 + FAILURE_STOP_S + HARD_STOP_MARGIN_S + ENDINGS_WAIT_S + 30


def test_every_host_came_so_the_same_hosts_go_on(round_of_b) -> None:
    assert _ended_by(round_of_b, Decision(attempt=1, hosts=("a", "b", "c"), by="a"), None) is None


def test_a_host_lost_ends_the_round_with_its_index_why_and_the_decided_attempt(round_of_b) -> None:
    decision = Decision(attempt=2, hosts=("b", "c"), lost={"a": "its lease expired"}, by="b")
    ended = _ended_by(round_of_b, decision, 1234.5)
    assert ended is not None
    assert (ended.code, ended.signalled, ended.lost, ended.why_lost, ended.next_attempt, ended.lost_at) == (
        exits.FAILED, None, frozenset({0}), {0: "its lease expired"}, 2, 1234.5)
    assert ended.cause == "host 0 (a) lost: its lease expired"


def test_a_join_ends_the_round_with_the_hosts_joining_and_when_it_was_asked(round_of_b) -> None:
    decision = Decision(attempt=2, hosts=("a", "b", "c", "d"), joined=("d",), joined_at=99.5, by="a")
    ended = _ended_by(round_of_b, decision, None)
    assert ended is not None
    assert (ended.code, ended.lost, ended.cause, ended.joining, ended.joining_at, ended.next_attempt) == (
        exits.OK, frozenset(), None, ("d",), 99.5, 2)


def test_the_job_ends_when_too_few_go_on_and_a_host_left_out_stands_by(round_of_b, capsys) -> None:
    """Too few: the round ends with its hosts lost, and the rounds (the one model: Membership) say the job ends; left
    out (its link was down, its machine paused): its round ends, and it stands by to be taken back."""
    small = Decision(attempt=1, hosts=(), lost={"a": "gone", "c": "gone"}, ended="1 host(s) left of 3", by="b")
    ended = _ended_by(round_of_b, small, None)
    assert ended is not None and (ended.code, ended.lost) == (exits.FAILED, frozenset({0, 2}))
    out = _ended_by(round_of_b, Decision(attempt=1, hosts=("a", "c"), lost={"b": "its lease expired"}, by="a"), None)
    assert out is not None and out.lost == frozenset() and out.cause == (
        "the other hosts went on without this one (a, c, from attempt 2): its lease expired")
    assert round_of_b.left_out == [out.cause] and out.code == exits.FAILED
    assert ("manual: the other hosts went on without this one (a, c, from attempt 2): its lease expired; this host "
            "stands by to be taken back at their next checkpoint") in capsys.readouterr().err


def test_a_signal_between_two_shares_ends_the_round_before_the_next_share(round_of_b) -> None:
    """SIGINT reached `run` after a decision, before the next share's agent handles signals: no share starts, and
    the job is over for every host."""
    round_of_b.stopped.append(signal.SIGINT)
    ended = run_round(round_of_b, None)
    assert (ended.code, ended.signalled, ended.lost) == (exits.from_signal(signal.SIGINT), signal.SIGINT, frozenset())
    assert round_of_b.decider.is_over() == {"how": "stopped", "by": "b"}


def test_sigterm_between_two_shares_is_this_hosts_leaving(round_of_b) -> None:
    round_of_b.stopped.append(signal.SIGTERM)
    ended = run_round(round_of_b, None)
    assert ended.signalled == signal.SIGTERM and round_of_b.decider.is_over() is None
    assert round_of_b.decider.members.leaving(0) == {"b"}


def test_a_spare_stands_by_until_a_decision_takes_it_in(endpoint) -> None:
    run_id = f"s{uuid.uuid4().hex[:6]}"
    host, spare = decider(endpoint, run_id, "h"), decider(endpoint, run_id, "s", "spare")
    taken = Decision(attempt=1, hosts=("h", "s"), taken=("s",), lost={"g": "gone"}, by="h")
    host.etcd.create(host.keys.attempt(1), taken.document())
    assert stand_by(spare, [], 5.0) == taken
    for d in (host, spare):
        d.leave()


def test_a_host_back_stands_by_until_a_later_decision_takes_it_in(endpoint, capsys) -> None:
    """c's `run` typed again: a decision of an attempt it stood by after (not the first, which named it) takes it in."""
    run_id = f"b{uuid.uuid4().hex[:6]}"
    host, back = decider(endpoint, run_id, "a"), decider(endpoint, run_id, "c")
    back.become("returning")
    host.etcd.create(host.keys.attempt(1), Decision(attempt=1, hosts=("a", "c"), by="a").document())
    host.etcd.create(host.keys.attempt(2), Decision(attempt=2, hosts=("a",), lost={"c": "gone"}, by="a").document())
    taken = Decision(attempt=3, hosts=("a", "c"), joined=("c",), joined_at=1.0, by="a")
    host.etcd.create(host.keys.attempt(3), taken.document())
    assert stand_by(back, [], 5.0, passed=frozenset({1, 2})) == taken
    assert "manual: host c back: waiting in the job's etcd to be taken in at the next checkpoint" in \
        capsys.readouterr().err
    for d in (host, back):
        d.leave()


def test_a_spare_not_taken_in_ends_when_the_job_is_over_or_no_host_came_or_a_signal(endpoint) -> None:
    run_id = f"n{uuid.uuid4().hex[:6]}"
    host, spare = decider(endpoint, run_id, "h"), decider(endpoint, run_id, "s", "spare")
    host.say_over("done")
    assert stand_by(spare, [], 5.0) == NotCalled("the job ended without calling this spare (h said it was done)",
                                                 job_done=True)
    for d in (host, spare):
        d.leave()
    alone = decider(endpoint, f"a{uuid.uuid4().hex[:6]}", "s", "spare")
    assert stand_by(alone, [], 0.5) == NotCalled("no host of the job came within 0.5 s of this spare's start "
                                                 "(init.timeout_s)", job_done=False)
    assert stand_by(alone, [signal.SIGTERM], 60) == NotCalled("SIGTERM: this spare stops standing by", job_done=False)
    alone.leave()


class _Refusing:
    """A decider whose come_back raises each of ``answers`` in turn (None: it comes back)."""

    every_s = 0.0

    def __init__(self, *answers: Exception | None) -> None:
        self.answers, self.tries = list(answers), 0

    def come_back(self) -> None:
        self.tries += 1
        answer = self.answers.pop(0)
        if answer is not None:
            raise answer


def test_a_host_left_out_comes_back_once_etcd_answers_within_its_patience(capsys) -> None:
    """etcd silent twice, then it answers: back; silent past the patience, or a second `run` of the host in its
    place, or a signal: not back, said why."""
    silent = EtcdError("timed out")
    back = _Refusing(silent, silent, None)
    assert come_back(back, [], patience_s=60) and back.tries == 3  # type: ignore[arg-type]
    assert not come_back(_Refusing(silent), [], patience_s=-1)  # type: ignore[arg-type]
    assert "cannot stand by to be taken back: the job's etcd did not answer: timed out" in capsys.readouterr().err
    in_its_place = _Refusing(AlreadyRunning("a `run` of host b is in this job already"))
    assert not come_back(in_its_place, [], 60)  # type: ignore[arg-type]
    assert "cannot stand by to be taken back: a `run` of host b is in this job already" in capsys.readouterr().err
    assert not come_back(_Refusing(None), [signal.SIGINT], 60)  # type: ignore[arg-type]
