"""launcher=manual: hosts that join a running job at its next checkpoint. A lost host whose `run` is started again by
hand comes back (runner.launchers.elastic.decisions: its member key says ``returning``), and a spare stands by, as
does a host that arrives (one the spec does not list: its member key carries its name, address and devices);
while an attempt runs, its host 0 — the one host that asks — looks for those it may take in (:class:`EtcdReturns`:
the candidates the rounds name, runner.launchers.elastic.membership.Membership.returning, each from when it may be,
up to topology.max_nodes), and once rank 0 has taken a step of the attempt (a recipe's stop handler is in place)
asks for the join in etcd (once: never where the job is over) and asks every rank to stop at its next checkpoint
(:class:`JoinAsk`), as a preemption's stop request does; the hosts then decide the next attempt with them
(runner.launchers.manual.rounds).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence

from runner.launchers.elastic.decisions import Decider, Joining
from runner.launchers.elastic.etcd import EtcdError
from runner.launchers.elastic.membership import Candidate, host_key
from runner.worker.agent_reports import AgentReport, AttemptBegan, StepReached


class EtcdReturns:
    """The candidates (lost hosts, spares) whose `run` stands by in the job's etcd, each from its due time, at most
    ``room`` of them (the runner.launchers.elastic.rounds.Returns of launcher=manual)."""

    def __init__(self, decider: Decider, candidates: Sequence[Candidate], room: int) -> None:
        self.decider, self.room = decider, room
        self.candidates = [c for c in candidates if c.joins]

    def start(self) -> EtcdReturns:
        return self

    def ready(self) -> tuple[str, ...]:
        """Those standing by now: the candidates due, then hosts that arrived (the spec does not list them), at most
        ``room``."""
        now = time.time()
        due = [host_key(c.host) for c in self.candidates if c.due <= now]
        if self.room < 1:
            return ()
        try:
            up = self.decider.members.standing_by()
            arrived = self.decider.members.arrivals() if up else {}
        except EtcdError:
            return ()
        named = {host_key(c.host) for c in self.candidates}
        return tuple([name for name in due if name in up]
                     + sorted(name for name in arrived if name in up and name not in named))[:self.room]

    def spares(self) -> tuple[str, ...]:
        return ()  # (a spare's `run` stands by in etcd from its start: none is "not ready at the start" here)

    def close(self) -> None:
        pass


class JoinAsk:
    """Host 0's part in a join during attempt ``attempt``: told each report of its agent (:meth:`heard`) and called
    at each look of the lease watch (:meth:`look`); ``stop``: asks every rank to stop at its next checkpoint.
    ``scripts``: the ranks run a script, which the stop request ends at any time (no step needs to come first)."""

    def __init__(self, decider: Decider, attempt: int, returns: EtcdReturns | None, stop: Callable[[], None],
                 scripts: bool) -> None:
        self.decider, self.attempt, self.returns, self.stop, self.scripts = decider, attempt, returns, stop, scripts
        self.stepping = False
        self.began: int | None = None  # the attempt this host's ranks began, not yet said in etcd
        self.asked: Joining | None = None

    def heard(self, report: AgentReport) -> None:
        """(In the agent's thread: nothing here waits on etcd.)"""
        if isinstance(report, AttemptBegan):
            self.began = report.attempt
            self.stepping = self.stepping or self.scripts
        elif isinstance(report, StepReached) and (report.resumed is None or report.step > report.resumed):
            self.stepping = True

    def look(self) -> None:
        """(In the lease watch's thread.) Every host says in etcd that its ranks began (a `run` of it started again
        then comes back as ``returning``); host 0 asks for a join where one is ready."""
        began, self.began = self.began, None
        if began is not None:
            try:
                self.decider.say_began(began)
            except EtcdError:
                self.began = began  # (said at the next look)
        if self.returns is None or self.asked is not None or not self.stepping:
            return
        ready = self.returns.ready()
        if not ready:
            return
        try:
            asked = self.decider.say_joining(self.attempt, Joining(ready, time.time()))
        except EtcdError:
            return
        if asked is None:  # the job is over
            return
        self.asked = asked
        names = ", ".join(asked.names)
        print(f"manual: {names} ready: the job takes {'them' if len(asked.names) > 1 else 'it'} in at the next "
              f"checkpoint (every rank is asked to stop there)", file=sys.stderr, flush=True)
        self.stop()
