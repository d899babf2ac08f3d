"""launcher=manual, a job that outlives its hosts (topology.min_nodes): this host's rounds (runner.launchers.elastic.
rounds), run by this host's `run`, as every other host's `run` runs its own.

A round is this host's share of the job on one set of hosts, attempt after attempt: the share runs (a HostAgent in
`run` itself, its peers watched: runner.launchers.manual.watch); when it ends badly, the hosts meet
(runner.launchers.manual.meeting). When every host came, the attempt starts again on the same hosts (a rank's
failure: launcher.max_restarts counts it); when some did not, the round ends with them lost and the next starts on
the hosts that came (runner.launchers.elastic.membership numbers them, the same on every host); when the chair's
group is not more than half of the hosts, or this host came too late, the job ends here. A share that ends otherwise
(done, or stopped by a signal) ends the round and the job; its host says farewell at its peers' and the spares'
points first. A spare's `run` stands by (:func:`stand_by`) until a chair calls it in, then runs its rounds as the
hosts' do.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from runner.common import exits
from runner.common.signals import handling
from runner.launchers.elastic.rounds import Ended
from runner.launchers.manual.meeting import Call, Decision, MeetingPoint, Peer, Windows, ask, meet, say_farewell
from runner.launchers.manual.watch import BEATS_MISSED, PeerWatch
from runner.plan.processes import Plan
from runner.records.paths import RunPaths
from runner.worker.agent_reports import AgentReport
from runner.worker.attempt_state import FAILURE_STOP_S, HARD_STOP_MARGIN_S
from runner.worker.channel_records import JobFailure
from runner.worker.host_agent import ENDINGS_WAIT_S, HostAgent
from runner.worker.share import HostShare
from runner.worker.zygote import Zygote
from runner.environments.process import ProcessEnvironment


@dataclass(frozen=True)
class Round:
    """This host's share on one set of hosts: ``node`` is its node rank in ``plan``, from ``paths.attempt`` on;
    ``first``: the job's first round (its hosts come as they are started by hand)."""

    plan: Plan
    paths: RunPaths
    environment: ProcessEnvironment
    point: MeetingPoint
    zygote: Zygote  # where every round's ranks are forked from (started once: runner.worker.zygote)
    node: int
    first: bool
    stopped: list[int] = field(default_factory=list)  # SIGINT/SIGTERM that reached `run` between shares (one list
    # for all of this host's rounds: ManualLauncher records them while no agent or meeting handles them)

    @property
    def peers(self) -> list[Peer]:
        return [Peer(h.label, str(h.reach)) for h in self.plan.job.hosts]

    @property
    def spares(self) -> list[Peer]:
        """The spares still kept ready, in order."""
        return [Peer(h.label, str(h.reach)) for h in self.plan.job.spares]

    def windows(self) -> Windows:
        """How long a meeting waits: four keepalive intervals for a silent point; for one that answers, the most its
        share can take to end (the ranks' grace and stop, host 0's wait for the others' endings) and a margin."""
        launcher = self.plan.job.spec.launcher
        ending_s = max(0.0, launcher.grace_s) + FAILURE_STOP_S + HARD_STOP_MARGIN_S + ENDINGS_WAIT_S
        return Windows(silent_s=BEATS_MISSED * launcher.manual.keepalive_s, come_s=ending_s + 30.0)


def run_round(this: Round, on_report: Callable[[int, AgentReport], None] | None) -> Ended:
    """This host's round (the module docstring) to its end."""
    paths, limit = this.paths, this.plan.job.spec.launcher.max_restarts
    while True:
        if this.stopped:  # between two shares: this host's share ends here, as the agent would have ended it
            say_farewell(this.point, [*this.peers, *this.spares])
            return Ended(code=exits.from_signal(this.stopped[0]), signalled=this.stopped[0], cause=None,
                         lost=frozenset())
        code, signalled, found = _share(this, paths, on_report)
        if code != exits.FAILED or signalled is not None:  # done, stopped, or refused: nothing to meet about
            say_farewell(this.point, [*this.peers, *this.spares])
            return Ended(code=code, signalled=signalled, cause=None, lost=frozenset())
        decision = _meeting(this, paths.attempt, {f.host: f.text.removeprefix("lost: ") for f in found})
        if isinstance(decision, Ended):
            return decision
        ended = _ended_by(this, decision, found[0].time if found else None)
        if ended is not None:
            return ended
        if decision.attempt > limit:
            return Ended(code=exits.FAILED, signalled=None, cause=f"launcher.max_restarts={limit} used",
                         lost=frozenset())
        paths = dataclasses.replace(paths, attempt=decision.attempt)
        print(f"\nrestarting: attempt {paths.attempt + 1} of {limit + 1} (launcher.max_restarts={limit}); every host "
              f"came to the meeting; the recipe resumes from its last checkpoint", file=sys.stderr, flush=True)


def _share(this: Round, paths: RunPaths, on_report: Callable[[int, AgentReport], None] | None,
           ) -> tuple[int, int | None, list[JobFailure]]:
    """One attempt of this host's share, its peers watched: its exit status, the signal that ended it, and the peers
    its watch found lost (in the order found)."""
    share = HostShare(plan=this.plan, node_rank=this.node, paths=paths, environment=this.environment, restarts=0)
    reporter = (lambda report: on_report(this.node, report)) if on_report else None
    agent = HostAgent(share, zygote=this.zygote, reporter=reporter)
    found: list[JobFailure] = []

    def lost(host: str, why: str) -> None:
        found.append(JobFailure(rank=None, host=host, text=f"lost: {why}"))
        print(f"manual: host {host} lost: {why}; ending this attempt", file=sys.stderr, flush=True)
        agent.end_job(found[-1])

    every_s = this.plan.job.spec.launcher.manual.keepalive_s
    watch = PeerWatch(this.point, this.peers, every_s, lost, seen=not this.first or paths.attempt > 0).start()
    try:
        code = agent.run()
    finally:
        watch.stop()
    return code, agent.signalled, found


def _meeting(this: Round, attempt: int, known_lost: dict[str, str]) -> Decision | Ended:
    """The meeting after ``attempt`` (``known_lost``: peers this host found lost, label -> why); a SIGINT or SIGTERM
    to `run` meanwhile ends the job here."""
    got: list[int] = []

    def stop(signum: int, _frame: object) -> None:
        got.append(signum)
        raise KeyboardInterrupt

    print(f"manual: attempt {attempt + 1} ended; meeting the other hosts ({', '.join(p.label for p in this.peers)})",
          file=sys.stderr, flush=True)
    try:
        with handling((signal.SIGINT, signal.SIGTERM), stop):
            return meet(this.point, this.peers, attempt, this.windows(), known_lost, this.spares)
    except KeyboardInterrupt:
        signum = got[0] if got else signal.SIGINT
        print(f"\n{signal.Signals(signum).name} during the meeting: this host's share ends", file=sys.stderr)
        return Ended(code=exits.from_signal(signum), signalled=signum, cause=None, lost=frozenset())


def _ended_by(this: Round, decision: Decision, lost_at: float | None) -> Ended | None:
    """What the decision ends: the job here (its group too small, or this host left out), or this round with hosts
    lost (the next round starts on those that went on); None: the same hosts again."""
    me = this.point.label
    if decision.ended is not None:
        print(f"manual: the job ends on this host: {decision.ended}", file=sys.stderr, flush=True)
        return Ended(code=exits.FAILED, signalled=None, cause=decision.ended, lost=frozenset())
    if me not in decision.went_on:
        why = (f"the other hosts went on without this one ({', '.join(decision.went_on)}, from attempt "
               f"{decision.attempt + 1}): it came to the meeting too late")
        print(f"manual: the job ends on this host: {why}", file=sys.stderr, flush=True)
        return Ended(code=exits.FAILED, signalled=None, cause=why, lost=frozenset())
    peers = this.peers
    lost = {i: decision.lost.get(p.label, "it did not come to the meeting") for i, p in enumerate(peers)
            if p.label not in decision.went_on}
    if not lost:
        return None
    for i, why in lost.items():
        print(f"manual: host {i} ({peers[i].label}) lost: {why}", file=sys.stderr, flush=True)
    cause = "; ".join(f"host {i} ({peers[i].label}) lost: {why}" for i, why in lost.items())
    return Ended(code=exits.FAILED, signalled=None, cause=cause, lost=frozenset(lost), lost_at=lost_at or time.time(),
                 why_lost=lost, next_attempt=decision.attempt, spares_gone=frozenset(decision.spares_gone))


@dataclass(frozen=True)
class NotCalled:
    """Why a spare's `run` ends without being called in; ``job_done``: a host said farewell (the job ended)."""

    why: str
    job_done: bool


def stand_by(point: MeetingPoint, job_hosts: list[Peer], every_s: float, silent_s: float, start_s: float,
             stopped: list[int]) -> Call | NotCalled:
    """A spare's `run`, until the chair of a meeting calls it in (its call), or why the job went on without it: a host
    said farewell (the job is over), or none of ``job_hosts`` (the spec's hosts and spares) has answered for
    ``silent_s`` since one last did (or within ``start_s`` of the start: hosts started by hand come when they come), or
    a signal reached `run` (``stopped``)."""
    print(f"manual: spare {point.label} ready (meeting point on port {point.port}): waiting to be called in",
          file=sys.stderr, flush=True)
    heard, started = None, time.monotonic()
    while not point.woken.wait(every_s):
        if stopped:
            return NotCalled(f"{signal.Signals(stopped[0]).name}: this spare stops standing by", job_done=False)
        now = time.monotonic()
        if any(ask(p.addr, point.port, {"run": point.run_id, "op": "ping", "host": point.label})[0] is not None
               for p in job_hosts if p.label != point.label):
            heard = now
        elif heard is not None and now - heard >= silent_s:
            return NotCalled(f"no host of the job answered for {silent_s:g} s: it is over", job_done=False)
        elif heard is None and now - started >= start_s:
            return NotCalled(f"no host of the job answered within {start_s:g} s of this spare's start "
                             f"(init.timeout_s)", job_done=False)
    if point.call is not None:
        return point.call
    return NotCalled(f"the job ended without calling this spare ({', '.join(sorted(point.farewells))} said farewell)",
                     job_done=True)
