"""runner.launchers.manual.joins: which of the candidates host 0 takes in (due, standing by in etcd, up to the room),
and when it asks (once rank 0 stepped, or a script's attempt began; once; never once the job is over); every host
says in etcd that its ranks began. A fake decider stands for etcd (the real one: tests/launchers/elastic/
test_decisions_elastic.py, and the join end to end: tests/e2e/test_lost_hosts_manual.py)."""

from __future__ import annotations

import time

import pytest

from runner.launchers.elastic.decisions import Joining
from runner.launchers.elastic.etcd import EtcdError
from runner.launchers.elastic.membership import Candidate
from runner.launchers.manual.joins import EtcdReturns, JoinAsk
from runner.spec.schema import HostConfig
from runner.worker.agent_reports import AttemptBegan, StepReached

pytestmark = pytest.mark.unit


class FakeDecider:
    """What joins asks of runner.launchers.elastic.decisions.Decider, kept in memory; ``fails``: etcd silent."""

    def __init__(self, returning: set[str] = frozenset(), spares: set[str] = frozenset(), over: bool = False,
                 arrived: set[str] = frozenset()) -> None:
        self._returning, self._spares, self.over, self.fails = set(returning), set(spares), over, False
        self._arrived = set(arrived)  # spares the spec does not list (their member key carries them)
        self.asked: list[Joining] = []
        self.began: list[int] = []

    def _etcd(self) -> None:
        if self.fails:
            raise EtcdError("timed out")

    @property
    def members(self) -> FakeDecider:  # (the reads of Decider.members, kept here too)
        return self

    def standing_by(self) -> set[str]:
        self._etcd()
        return self._returning | self._spares | self._arrived

    def arrivals(self) -> dict[str, HostConfig]:
        self._etcd()
        return {name: HostConfig(name=name, addr=f"10.0.0.{i + 9}", devices=1)
                for i, name in enumerate(sorted(self._arrived))}

    def say_joining(self, attempt: int, joining: Joining) -> Joining | None:
        self._etcd()
        if self.over:
            return None
        self.asked.append(joining)
        return self.asked[0]

    def say_began(self, attempt: int) -> None:
        self._etcd()
        self.began.append(attempt)


def candidate(name: str, due: float = 0.0, joins: bool = True) -> Candidate:
    return Candidate(HostConfig(name=name), due, joins)


def test_those_due_and_standing_by_are_ready_up_to_the_room() -> None:
    decider = FakeDecider(returning={"c", "d"}, spares={"s"})
    later = time.time() + 3600
    returns = EtcdReturns(decider, [candidate("c"), candidate("e"), candidate("d", due=later), candidate("s"),
                                    candidate("t", joins=False)], room=2)
    assert returns.ready() == ("c", "s")  # e does not stand by, d not due (launcher.rejoin_after_s), t only kept ready
    assert EtcdReturns(decider, [candidate("c"), candidate("s")], room=1).ready() == ("c",)
    assert EtcdReturns(decider, [candidate("c")], room=0).ready() == ()
    decider.fails = True
    assert returns.ready() == ()  # etcd silent: nobody yet
    assert returns.start() is returns and returns.spares() == ()


def asker(decider: FakeDecider, ready: tuple[str, ...] = ("c",), scripts: bool = False,
          host0: bool = True) -> tuple[JoinAsk, list[int]]:
    stops: list[int] = []
    returns = EtcdReturns(decider, [candidate(n) for n in ready], room=len(ready)) if host0 else None
    return JoinAsk(decider, 1, returns, lambda: stops.append(1), scripts), stops


def test_a_host_that_arrives_standing_by_is_ready_after_the_candidates_and_within_the_room() -> None:
    """A host the spec does not list (launcher.manual.host=<its name>) is no candidate of the rounds: host 0 finds it
    in etcd, standing by, and takes it in after the candidates due, while there is room."""
    decider = FakeDecider(returning={"c"}, arrived={"x", "w"})
    assert EtcdReturns(decider, [candidate("c")], room=3).ready() == ("c", "w", "x")
    assert EtcdReturns(decider, [candidate("c")], room=2).ready() == ("c", "w")
    assert EtcdReturns(decider, [], room=1).ready() == ("w",)
    assert EtcdReturns(decider, [], room=0).ready() == ()


def test_host_0_asks_once_rank_0_has_stepped_and_only_once() -> None:
    decider = FakeDecider(returning={"c"})
    ask, stops = asker(decider)
    ask.look()
    ask.heard(AttemptBegan(attempt=1, at=0.0))
    ask.heard(StepReached(attempt=1, step=40, resumed=40, at=0.0))  # the resumed step
    ask.look()
    assert (decider.asked, stops, decider.began) == ([], [], [1])  # no step of this attempt yet: no stop handler
    ask.heard(StepReached(attempt=1, step=41, resumed=40, at=0.0))
    ask.look()
    ask.look()
    assert [j.names for j in decider.asked] == [("c",)] and stops == [1]
    assert ask.asked is not None and ask.asked.names == ("c",)


def test_a_script_is_asked_once_its_attempt_began_and_a_job_over_is_not_asked() -> None:
    decider = FakeDecider(returning={"c"})
    ask, stops = asker(decider, scripts=True)
    ask.heard(AttemptBegan(attempt=1, at=0.0))
    ask.look()
    assert stops == [1]  # (a script's stop request is SIGTERM, at any time)
    over = FakeDecider(returning={"c"}, over=True)
    ask, stops = asker(over, scripts=True)
    ask.heard(AttemptBegan(attempt=1, at=0.0))
    ask.look()
    assert stops == [] and ask.asked is None


def test_every_host_says_its_ranks_began_again_after_etcd_was_silent_and_only_host_0_asks() -> None:
    decider = FakeDecider(returning={"c"})
    ask, stops = asker(decider, host0=False)
    ask.heard(AttemptBegan(attempt=1, at=0.0))
    ask.heard(StepReached(attempt=1, step=5, resumed=None, at=0.0))
    decider.fails = True
    ask.look()
    decider.fails = False
    ask.look()
    ask.look()
    assert decider.began == [1] and stops == [] and decider.asked == []
