"""A job that outlives its hosts (topology.min_nodes, topology.spares: runner.spec.elastic): the launch runs it round
after round, each on the hosts that remain.

A round is one launch of the job's shares on one set of hosts, to its end: under launcher=ssh the hosts' shares started
over ssh by the launching `run`, their output relayed, their records taken back (runner.launchers.ssh.launcher); under
launcher=slurm an srun step of the allocation (runner.launchers.slurm.rounds); under launcher=manual this host's share,
run by this host's `run` as every other host's runs its own, the hosts deciding the next attempt in etcd
(runner.launchers.manual.rounds, runner.launchers.elastic.decisions). A round that ends with a host lost (what lost
means: runner.launchers.elastic.liveness; its ssh session gone or silent; its Slurm task silent, or its node out of the
allocation; its lease in etcd expired) has already ended the attempt on every other host; then the next round starts
at the next attempt on the hosts
:class:`~runner.launchers.elastic.membership.Membership` chooses (the survivors, renumbered, then spares in the lost
hosts' places), checked again, with a rendezvous of its own on the new host 0. The ranks resume from the last
checkpoint: the newest complete copy any host holds (runner.training.copies). Each change is a line of membership.jsonl
(runner.records.membership), written once the next attempt's first step is seen (or the round ends without one).
The job ends with the first round that ends without a loss, on a signal, with fewer than topology.min_nodes hosts
left, or once launcher.max_restarts attempts are used; nothing of a round is left when the next starts.

The rendezvous store is therefore no single point of failure: each round's store lives on that round's host 0, and
losing it loses that round only.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace
from collections.abc import Callable, Sequence
from typing import Protocol

from runner.common import exits
from runner.launchers.base import LaunchOutcome
from runner.launchers.elastic.membership import CannotGoOn, Candidate, Membership, host_key
from runner.plan.processes import Plan
from runner.records.membership import MembershipChange, append_change
from runner.records.paths import RunPaths
from runner.spec.schema import HostConfig, JobConfig
from runner.worker.agent_reports import AgentReport, AttemptBegan, Leaving, StepReached


@dataclass(frozen=True)
class Ended:
    """How a round ended: the exit status for `run`, the signal it passed on, and a host lost."""

    code: int
    signalled: int | None
    cause: str | None  # "host 1 (b): its ssh session ended ..." where a host was lost
    lost: frozenset[int]  # those hosts' indices
    lost_at: float | None = None  # when the first was seen lost (time.time())
    why_lost: dict[int, str] = field(default_factory=dict)  # each lost host's index -> how it was seen
    next_attempt: int | None = None  # the attempt the hosts that remain go on with (launcher=manual's decision in
    # etcd); None: the one after the last that began
    spares_gone: frozenset[str] = frozenset()  # spares found gone meanwhile (launcher=manual's decision): not taken
    joining: tuple[str, ...] = ()  # lost hosts that answered again: the round stopped at a checkpoint to take them
    joining_at: float | None = None  # when they were found to answer (time.time())
    arrivals: tuple[HostConfig, ...] = ()  # of those joining, hosts the spec does not list (launcher=manual)


class Round(Protocol):
    """What a round is run with: a launch of one set of hosts (an ssh launch, an srun step)."""

    plan: Plan
    paths: RunPaths

    def sessions(self, on_report: Callable[[int, AgentReport], None] | None = None,
                 replacing: Sequence[str] = (), returns: Returns | None = None) -> tuple[Ended, list[str]]: ...

    def on(self, spec: JobConfig, attempt: int) -> Round: ...

    def returns(self, candidates: Sequence[Candidate]) -> Returns | None:
        """The hosts ``candidates`` (lost ones, spares not ready at the start) tried while the round runs; None: this
        launch takes no host back (topology.max_nodes: launcher=ssh)."""

    def left_out(self) -> dict[int, str] | LaunchOutcome:
        """The check before a round after the first: the hosts that fail it, each with why (empty: every host ready;
        an outcome: the check was interrupted)."""


class Returns(Protocol):
    """Lost hosts tried again while a round runs (runner.launchers.ssh.rejoin)."""

    def start(self) -> Returns:
        """Begin trying (once the round's shares are started)."""

    def ready(self) -> tuple[str, ...]:
        """The names of those that answered and join (empty: none yet)."""

    def spares(self) -> tuple[str, ...]:
        """The names of the spares, not ready at the start, that answered: kept ready now."""

    def close(self) -> None:
        """Stop trying; nothing it started is left."""


@dataclass
class _RoundReports:
    """What the hosts of a round reported (runner.worker.agent_reports), as this `run` heard it: the latest attempt
    that began, rank 0's last step of each attempt, and when (this machine's clock) each attempt's first step came."""

    attempt: int
    last_step: dict[int, int] = field(default_factory=dict)
    resumed: dict[int, int | None] = field(default_factory=dict)
    copies: dict[int, tuple[str | None, int | None]] = field(default_factory=dict)  # the copy each attempt resumed from
    first_step_at: dict[int, float] = field(default_factory=dict)
    leaving: dict[int, Leaving] = field(default_factory=dict)  # hosts that said they leave (SIGTERM to their `run`)

    def heard(self, host: int, report: AgentReport) -> None:
        if isinstance(report, Leaving):
            self.leaving.setdefault(host if report.host is None else report.host, report)
        elif isinstance(report, AttemptBegan):
            self.attempt = max(self.attempt, report.attempt)
        elif isinstance(report, StepReached):
            self.last_step[report.attempt] = report.step
            self.resumed.setdefault(report.attempt, report.resumed)
            self.copies.setdefault(report.attempt, (report.copy_host, report.copy_save))
            if report.resumed is None or report.step > report.resumed:
                self.first_step_at.setdefault(report.attempt, time.time())


def _with_leavers(ended: Ended, heard: _RoundReports, plan: Plan) -> Ended:
    """A round whose hosts said they leave (SIGTERM to their own `run`: a preempted machine) ended with them lost,
    unless the `run` that holds the job was stopped itself: the others go on without them, from the checkpoint the
    stop made them save."""
    if not heard.leaving or ended.signalled is not None:
        return ended
    names = [h.label for h in plan.job.hosts]
    leavers = {i: r for i, r in heard.leaving.items() if 0 <= i < len(names)}
    left = {i: f"it left: {r.why}" if r.preempted else f"left out: {r.why}" for i, r in leavers.items()}
    for i, r in leavers.items():
        print(f"{plan.job.spec.launcher.kind}: host {i} ({names[i]}) " + (
              f"left the job ({r.why}: a preempted machine)" if r.preempted else f"is left out: {r.why}")
              + "; the others go on without it", file=sys.stderr, flush=True)
    cause = "; ".join(f"host {i} ({names[i]}) {'left' if r.preempted else 'left out'}: {r.why}"
                      for i, r in leavers.items())
    return replace(ended, code=exits.FAILED, lost=ended.lost | frozenset(left), cause=ended.cause or cause,
                   why_lost={**left, **ended.why_lost},
                   lost_at=ended.lost_at or min(r.at for r in heard.leaving.values()))


# how a host taken in came back, and what found it, by launcher
_BACK = {"ssh": ("answered again", "launcher.ssh.rejoin_s"),
         "manual": ("back: its `run` started again, or left out while it lived on", "it stood by in the job's etcd")}


class AttemptsOnHosts:
    """The rounds of a job that outlives its hosts, from ``first`` (the launch as `run` made it: its spec's
    hosts), as the module docstring says."""

    def __init__(self, first: Round, unready: Sequence[str] = (), membership: Membership | None = None) -> None:
        self.first = first
        self.unready = tuple(unready)  # spares that failed the check of the start: tried while the rounds run
        self.spec = first.plan.job.spec
        # the hosts of its first round: its spec's, or those a decision named (a host taken in while the job runs,
        # which also knows the lost hosts that may come back)
        self.membership = membership or Membership.of(self.spec)
        self.said_as = self.spec.launcher.kind  # what its lines begin with: "ssh", "slurm"
        self.pending: MembershipChange | None = None  # a change whose next attempt's first step is not seen yet

    def run(self) -> LaunchOutcome:
        launcher, membership, attempt = self.first, self.membership.with_unready(self.unready), self.first.paths.attempt
        limit = self.spec.launcher.max_restarts
        records: list[str] = []  # what the last round took back from the hosts: the next round's replace them
        while True:
            heard = _RoundReports(attempt)
            # a lost host may come back while a restart is left to take it with (each join is one)
            returns = launcher.returns(membership.returning(time.time(), self.spec.launcher.rejoin_after_s)) \
                if attempt < limit else None
            try:
                ended, records = launcher.sessions(on_report=lambda host, report: self._heard(heard, host, report),
                                                   replacing=records, returns=returns)
            finally:
                if returns is not None:
                    returns.close()
                    membership = membership.with_spares_ready(returns.spares())
            ended = _with_leavers(ended, heard, launcher.plan)
            self._write_pending(heard)
            if not (ended.lost or ended.joining) or ended.signalled is not None:
                return LaunchOutcome(code=ended.code, signalled=ended.signalled, cause=ended.cause, plan=launcher.plan)
            attempt = ended.next_attempt if ended.next_attempt is not None else heard.attempt + 1
            membership = membership.with_arrivals(ended.arrivals)
            chosen = membership.without_spares(ended.spares_gone).after_loss(ended.lost)
            if isinstance(chosen, CannotGoOn) or attempt > limit:
                why = chosen.why if isinstance(chosen, CannotGoOn) else f"launcher.max_restarts={limit} used"
                append_change(self.first.paths, self._change(launcher, membership, ended, heard, None, ()))
                print(f"{self.said_as}: the job ends: {why}", file=sys.stderr, flush=True)
                return LaunchOutcome(code=exits.FAILED, cause=f"{ended.cause}; {why}", plan=launcher.plan)
            kept = chosen.membership  # why each may be taken in (else: a lost host that answered again)
            why_in = {**{host_key(h): "a spare, topology.max_nodes leaving room" for h in kept.spares},
                      **{host_key(h): "ready, a spare not ready at the start" for h in kept.unready},
                      **{host_key(h): "arrived, a host the spec does not list, topology.max_nodes leaving room"
                         for h in ended.arrivals}}
            if ended.joining:
                chosen = replace(chosen.membership.after_return(ended.joining, ended.joining_at or time.time()),
                                 taken=chosen.taken)
            after, taken = chosen.membership, chosen.taken
            following = launcher.on(after.spec(self.spec, attempt), attempt)
            self.pending = self._change(launcher, membership, ended, heard, following,
                                        tuple(host_key(h) for h in taken),
                                        tuple(host_key(h) for h in chosen.back), why_in)
            print(f"{self.said_as}: restarting on {len(after.hosts)} host(s) ({', '.join(after.names)}) from the last "
                  f"checkpoint: attempt {attempt + 1} of {limit + 1} (launcher.max_restarts={limit})"
                  + (f", spare(s) {', '.join(self.pending.spares)} in the lost host's place" if taken else "")
                  + (f", {', '.join(self.pending.joined)} taken in" if chosen.back else ""),
                  file=sys.stderr, flush=True)
            checked = self._checked(following, after, attempt, limit)
            if isinstance(checked, LaunchOutcome):
                return checked
            launcher, membership = checked

    def _checked(self, launcher: Round, membership: Membership, attempt: int, limit: int
                 ) -> tuple[Round, Membership] | LaunchOutcome:
        """The next round's hosts checked as at the start: a host that fails is left out as a lost host is (a spare in
        its place where one is kept; it may come back once it passes the check), the change pending saying so, until
        every host is ready; or how the job ends (fewer than topology.min_nodes hosts ready)."""
        while True:
            left = launcher.left_out()
            if isinstance(left, LaunchOutcome):  # Ctrl-C during the check
                self._write_pending(_RoundReports(attempt))
                return replace(left, plan=launcher.plan)
            if not left:
                return launcher, membership
            names = membership.names
            cause = "; ".join(f"{names[i]}: {why} (before attempt {attempt + 1})" for i, why in sorted(left.items()))
            chosen = membership.after_loss(left)
            pending = self.pending
            if isinstance(chosen, CannotGoOn):
                if pending is not None:
                    self.pending = replace(pending, after=(), world_size_after=0, next_attempt=None,
                                           lost=(*pending.lost, *(names[i] for i in sorted(left))),
                                           cause=f"{pending.cause}; {cause}")
                self._write_pending(_RoundReports(attempt))
                print(f"{self.said_as}: the job ends: {chosen.why}", file=sys.stderr, flush=True)
                return LaunchOutcome(code=exits.FAILED, cause=f"{cause}; {chosen.why}", plan=launcher.plan)
            following = launcher.on(chosen.membership.spec(self.spec, attempt), attempt)
            if pending is not None:
                self.pending = replace(
                    pending, after=tuple(h.label for h in following.plan.job.hosts),
                    world_size_after=following.plan.world_size, lost=(*pending.lost, *(names[i] for i in sorted(left))),
                    spares=(*pending.spares, *(host_key(h) for h in chosen.taken)),
                    joined=tuple(n for n in pending.joined if n not in {names[i] for i in left}),
                    cause=f"{pending.cause}; {cause}")
            print(f"{self.said_as}: restarting on {len(chosen.membership.hosts)} host(s) "
                  f"({', '.join(chosen.membership.names)}) without {', '.join(names[i] for i in sorted(left))}: attempt "
                  f"{attempt + 1} of {limit + 1} (launcher.max_restarts={limit})", file=sys.stderr, flush=True)
            launcher, membership = following, chosen.membership

    def _heard(self, heard: _RoundReports, host: int, report: AgentReport) -> None:
        heard.heard(host, report)
        if self.pending is not None and self.pending.next_attempt in heard.first_step_at:
            self._write_pending(heard)  # at once: the record does not wait for the round's end

    @staticmethod
    def _change(launcher: Round, before: Membership, ended: Ended, heard: _RoundReports,
                following: Round | None, spares: tuple[str, ...], joined: tuple[str, ...] = (),
                why_in: dict[str, str] | None = None) -> MembershipChange:
        """The change a round's lost hosts, and the hosts taken in (lost ones back; spares, ``why_in`` saying which),
        make: to ``following``'s hosts (None: the job ends)."""
        why_in = why_in or {}
        lost = tuple(before.names[i] for i in sorted(ended.lost))
        back, how = _BACK.get(launcher.plan.job.spec.launcher.kind, _BACK["ssh"])
        cause = "; ".join([*(f"{before.names[i]}: {ended.why_lost[i]}" for i in sorted(ended.lost)
                             if i in ended.why_lost),
                           *(f"{name}: {why_in.get(name, back)} ({how})" for name in joined)])
        return MembershipChange(
            time=ended.lost_at or ended.joining_at or time.time(), attempt=heard.attempt, joined=joined,
            next_attempt=following.paths.attempt if following is not None else None, before=before.names,
            after=tuple(h.label for h in following.plan.job.hosts) if following is not None else (), lost=lost,
            cause=cause or str(ended.cause), spares=spares, world_size_before=launcher.plan.world_size,
            world_size_after=following.plan.world_size if following is not None else 0,
            last_step=heard.last_step.get(heard.attempt))

    def _write_pending(self, heard: _RoundReports) -> None:
        """The change pending, with what the next attempt's round said of its start (its first step, where one came),
        into membership.jsonl."""
        change, self.pending = self.pending, None
        if change is None:
            return
        attempt = -1 if change.next_attempt is None else change.next_attempt  # (None: the job ended; no attempt's)
        first = heard.first_step_at.get(attempt)
        host, save = heard.copies.get(attempt, (None, None))
        append_change(self.first.paths, replace(
            change, resumed_from=heard.resumed.get(attempt), resumed_from_host=host, resumed_from_save=save,
            to_first_step_s=round(first - change.time, 3) if first is not None else None))
