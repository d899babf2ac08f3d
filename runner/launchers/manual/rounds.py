"""launcher=manual, a job that outlives its hosts (topology.min_nodes): this host's rounds (runner.launchers.elastic.
rounds), run by this host's `run`, as every other host's `run` runs its own, the hosts agreeing through etcd
(runner.launchers.elastic.decisions).

A round is this host's share of the job on one set of hosts, attempt after attempt: the share runs (a HostAgent in
`run` itself, its lease kept alive and its peers' watched: runner.launchers.manual.watch); when it ends badly, this
host says so in etcd and follows the decision for the next attempt, the one that exists. When every host came (a
rank's failure), the attempt starts again on the same hosts (launcher.max_restarts counts it); when some did not, the
round ends with them lost and the next starts on the hosts the decision names (runner.launchers.elastic.membership
numbers them, the same on every host); where the decision leaves this host out (its link was down, its machine
paused), its round ends and its `run` stands by to be taken back (``HostRound.left_out``); where etcd cannot be
reached, the job ends here. A share that ends otherwise (done, or stopped by a signal) ends the round and the job;
its host says the job is over in etcd first, unless a join was asked at the attempt's checkpoint
(runner.launchers.manual.joins: the stop every rank took was for it): then the hosts decide the next attempt, with
those joining after them, and the round ends with them joining. A spare's `run`, the `run` of a lost host started
again, and a host left out, stand by (:func:`stand_by`) until a decision takes them in, then run their rounds as the
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
from runner.launchers.elastic.decisions import AlreadyRunning, Decider, Decision
from runner.launchers.elastic.etcd import EtcdError
from runner.launchers.elastic.membership import Membership
from runner.launchers.elastic.rounds import Ended
from runner.launchers.manual.joins import EtcdReturns, JoinAsk
from runner.launchers.manual.watch import LeaseWatch
from runner.plan.processes import Plan
from runner.records.paths import RunPaths
from runner.worker.agent_reports import AgentReport, Leaving
from runner.worker.channel_records import JobFailure
from runner.worker.attempt_report import ENDINGS_WAIT_S
from runner.worker.host_agent import HostAgent
from runner.worker.share import HostShare, hard_stop_s
from runner.worker.zygote import Zygote
from runner.environments.process import ProcessEnvironment
from runner.spec.schema import HostConfig, is_script


@dataclass(frozen=True)
class HostRound:
    """This host's share on one set of hosts: ``node`` is its node rank in ``plan``, from ``paths.attempt`` on."""

    plan: Plan
    paths: RunPaths
    environment: ProcessEnvironment
    decider: Decider
    zygote: Zygote  # where every round's ranks are forked from (started once: runner.worker.zygote)
    node: int
    max_nodes: int  # the most hosts the job grows back to (topology.max_nodes, of the pinned spec)
    stopped: list[int] = field(default_factory=list)  # SIGINT/SIGTERM that reached `run` between shares (one list
    # for all of this host's rounds: ManualLauncher records them while no agent handles them)
    left_out: list[str] = field(default_factory=list)  # why the others went on without this host while its `run`
    # lived on (one list for all of its rounds: ManualLauncher has it stand by to be taken back)

    @property
    def hosts(self) -> list[str]:
        return [h.label for h in self.plan.job.hosts]

    @property
    def membership(self) -> Membership:
        return Membership.of(self.plan.job.spec)

    def come_s(self) -> float:
        """How long the hosts wait for one that is up but has not ended its share of the attempt: the most its share
        can take to end (the ranks' grace and stop, host 0's wait for the others' endings) and a margin."""
        return hard_stop_s(self.plan.job.spec.launcher) + ENDINGS_WAIT_S + 30.0


def run_round(this: HostRound, on_report: Callable[[int, AgentReport], None] | None,
              returns: EtcdReturns | None = None) -> Ended:
    """This host's round (the module docstring) to its end; ``returns``: those host 0 may take in meanwhile."""
    paths, limit = this.paths, this.plan.job.spec.launcher.max_restarts
    while True:
        if this.stopped:  # between two shares: this host's share ends here, as the agent would have ended it
            return _stopped(this, paths.attempt, this.stopped[0])
        code, signalled, found, following = _share(this, paths, on_report, returns)
        leaving = _leaving(this, paths.attempt)
        how, why = leaving.get(this.decider.label, ("", ""))
        if how == "left out":  # the data-network check named it: the others go on without it
            print(f"manual: this host is left out of the job: {why}; the others go on without it; its `run` typed "
                  f"again (its data network mended) joins at a checkpoint, checked again", file=sys.stderr, flush=True)
            return Ended(code=exits.FAILED, signalled=None, cause=why, lost=frozenset())
        if how:  # this host left: the others go on without it
            signum = signalled or signal.SIGTERM
            print(f"manual: this host left the job ({signal.Signals(signum).name}: its ranks saved their "
                  f"checkpoint); the others go on without it", file=sys.stderr, flush=True)
            return Ended(code=exits.from_signal(signum), signalled=signum, cause=None, lost=frozenset())
        if (code != exits.FAILED or signalled is not None) and not leaving \
                and this.decider.say_over("done" if code == exits.OK else "stopped" if signalled is not None else
                                          "failed", None if signalled is not None else paths.attempt):
            return Ended(code=code, signalled=signalled, cause=None, lost=frozenset())  # nothing to decide
        # (else a failure, hosts that left, or the stop every rank took was for a join: the hosts decide)
        for label, (how, why) in sorted(leaving.items()):
            print(f"manual: {label} left the job (SIGTERM to its `run`: a preempted machine); the ranks saved their "
                  f"checkpoint" if how == "leaving" else f"manual: {label} is left out: {why}", file=sys.stderr,
                  flush=True)
        decision = following or _next(this, paths.attempt, found)  # (the watch saw it: the others went on)
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
              f"ended the last one; the recipe resumes from its last checkpoint", file=sys.stderr, flush=True)


def _stopped(this: HostRound, attempt: int, signum: int) -> Ended:
    """A signal to `run` between two shares: SIGTERM, this host leaves (the others go on); SIGINT, the job stops."""
    if signum == signal.SIGTERM:
        _say_leaving(this, attempt, signum)
    else:
        this.decider.say_over("stopped")
    return Ended(code=exits.from_signal(signum), signalled=signum, cause=None, lost=frozenset())


def _say_leaving(this: HostRound, attempt: int, signum: int) -> None:
    """SIGTERM to this host's `run` (a preempted machine): it leaves the job, said in etcd before its ranks stop, so
    that the other hosts, stopped with it, go on without it (a stop anywhere else stops the job)."""
    if signum != signal.SIGTERM:
        return
    try:
        this.decider.say_ended(attempt, "leaving", f"{signal.Signals(signum).name} to its `run`")
    except EtcdError:
        pass  # (the others find it lost once its lease expires)


def _leaving(this: HostRound, attempt: int) -> dict[str, tuple[str, str]]:
    """The hosts that left ``attempt``, each with how and why (runner.launchers.elastic.launch_keys.Members.leavers)."""
    try:
        return this.decider.members.leavers(attempt)
    except EtcdError:
        return {}


def _share(this: HostRound, paths: RunPaths, on_report: Callable[[int, AgentReport], None] | None,
           returns: EtcdReturns | None) -> tuple[int, int | None, list[JobFailure], Decision | None]:
    """One attempt of this host's share, its lease kept alive and its peers watched (and, on host 0, those that may
    join looked for: runner.launchers.manual.joins): its exit status, the signal that ended it, the peers found lost
    (in the order found), and the decision for the next attempt where the watch saw the others go on without this
    host."""
    share = HostShare(plan=this.plan, node_rank=this.node, paths=paths, environment=this.environment, restarts=0)
    joins = JoinAsk(this.decider, paths.attempt, returns if this.node == 0 else None, lambda: agent.stop_ranks(),
                    is_script(this.plan.job.spec.recipe))

    def reporter(report: AgentReport) -> None:
        if isinstance(report, Leaving) and not report.preempted:  # the data-network check named this host: said in
            try:  # etcd, where the hosts decide (its round ends on it: run_round)
                this.decider.say_ended(paths.attempt, "left out", report.why)
            except EtcdError:
                pass  # (the others find it lost once its lease expires)
            return
        joins.heard(report)
        if on_report is not None:
            on_report(this.node, report)

    agent = HostAgent(share, zygote=this.zygote, reporter=reporter,
                      on_signal=lambda signum: _say_leaving(this, paths.attempt, signum))
    found: list[JobFailure] = []

    def lost(host: str, why: str) -> None:
        found.append(JobFailure(rank=None, host=host, text=f"lost: {why}"))
        print(f"manual: host {host} lost: {why}; ending this attempt", file=sys.stderr, flush=True)
        agent.end_job(found[-1])

    def out(why: str) -> None:
        print(f"manual: this host is out of the job: {why}; ending this attempt", file=sys.stderr, flush=True)
        agent.end_job(JobFailure(rank=None, host=this.decider.label, text=f"out: {why}"))

    watch = LeaseWatch(this.decider, this.hosts, paths.attempt, lost, out, also=joins.look).start()
    try:
        code = agent.run()
    finally:
        watch.stop()
    return code, agent.signalled, found, watch.following


def _next(this: HostRound, attempt: int, found: list[JobFailure]) -> Decision | Ended:
    """The decision for the attempt after ``attempt``, once this host said in etcd that it ended; a SIGINT or SIGTERM
    to `run` meanwhile, or etcd out of reach for as long as the others take to find this host lost and end their
    shares, ends the job here."""
    decider = this.decider
    print(f"manual: attempt {attempt + 1} ended; waiting for the decision on the next (the job's etcd)",
          file=sys.stderr, flush=True)
    try:
        decision = decider.next_attempt(this.membership, attempt, this.come_s(), lambda: bool(this.stopped),
                                        how="failed", why="; ".join(f.text for f in found),
                                        patience_s=decider.lost_after_s + hard_stop_s(this.plan.job.spec.launcher))
    except EtcdError as e:
        why = (f"the job's etcd cannot be reached, so this host cannot learn who goes on: {e} (its `run` typed again "
               f"joins the job at a checkpoint)")
        print(f"manual: the job ends on this host: {why}", file=sys.stderr, flush=True)
        return Ended(code=exits.FAILED, signalled=None, cause=why, lost=frozenset())
    if decision is None:
        signum = this.stopped[0]
        print(f"\n{signal.Signals(signum).name} while waiting for the decision: this host's share ends",
              file=sys.stderr)
        return _stopped(this, attempt, signum)
    print(f"manual: decided by {decision.by}: attempt {decision.attempt + 1} on "
          f"{', '.join(decision.hosts) or 'no host'}" + (f" ({decision.ended})" if decision.ended else ""),
          file=sys.stderr, flush=True)
    return decision


def _ended_by(this: HostRound, decision: Decision, lost_at: float | None) -> Ended | None:
    """What the decision ends: this host's round where it is left out (it stands by then: ``this.left_out``), or
    this round with hosts lost or joining (the next round starts on those the decision names; where it ends the job,
    the rounds say so); None: the same hosts again."""
    me, hosts = this.decider.label, this.hosts
    lost = {i: decision.lost[h] for i, h in enumerate(hosts) if h in decision.lost}
    if decision.ended is None and me not in decision.hosts:
        why = (f"the other hosts went on without this one ({', '.join(decision.hosts)}, from attempt "
               f"{decision.attempt + 1}): {decision.lost.get(me, 'it was not among them')}")
        print(f"manual: {why}; this host stands by to be taken back at their next checkpoint", file=sys.stderr,
              flush=True)
        this.left_out.append(why)
        return Ended(code=exits.FAILED, signalled=None, cause=why, lost=frozenset())
    if not lost and not decision.joined:
        return None
    for i, why in lost.items():
        print(f"manual: host {i} ({hosts[i]}) lost: {why}", file=sys.stderr, flush=True)
    cause = "; ".join(f"host {i} ({hosts[i]}) lost: {why}" for i, why in lost.items())
    arrived = arrivals_of(this.decider) if decision.joined else {}
    return Ended(code=exits.FAILED if lost else exits.OK, signalled=None, cause=cause or None, lost=frozenset(lost),
                 lost_at=(lost_at or time.time()) if lost else None, why_lost=lost, next_attempt=decision.attempt,
                 spares_gone=frozenset(decision.spares_gone), joining=decision.joined,
                 joining_at=decision.joined_at, arrivals=tuple(arrived[n] for n in decision.joined if n in arrived))


def arrivals_of(decider: Decider) -> dict[str, HostConfig]:
    """The hosts that arrived (the spec does not list them) whose member key is in the job's etcd, by name."""
    try:
        return decider.members.arrivals()
    except EtcdError:
        return {}


@dataclass(frozen=True)
class NotCalled:
    """Why a spare's `run` ends without being called in; ``job_done``: a host said the job was over."""

    why: str
    job_done: bool


def stand_by(decider: Decider, stopped: list[int], start_s: float, passed: frozenset[int] = frozenset(),
             ) -> Decision | NotCalled:
    """A spare's `run` (or a lost host's, started again: ``decider.role`` is ``returning``), its lease kept alive,
    until a decision takes it in (that decision: one of an attempt not in ``passed``, those made before it stood by),
    or why the job went on without it: a host said the job was over, it is out of the job (its lease, or etcd
    silent), or a signal reached `run` (``stopped``). ``start_s``: how long it waits for the job's first host."""
    if decider.role == "returning":
        print(f"manual: host {decider.label} back: waiting in the job's etcd to be taken in at the next checkpoint",
              file=sys.stderr, flush=True)
    else:
        print(f"manual: spare {decider.label} ready: waiting in the job's etcd to be taken in", file=sys.stderr,
              flush=True)
    started = time.monotonic()
    this = "this spare" if decider.role == "spare" else "this host"
    while True:
        if stopped:
            return NotCalled(f"{signal.Signals(stopped[0]).name}: {this} stops standing by", job_done=False)
        if decider.out is not None:
            return NotCalled(decider.out, job_done=False)
        try:
            over = decider.is_over()
            if over is not None:
                return NotCalled(f"the job ended without calling {this} ({over.get('by')} said it was "
                                 f"{over.get('how')})", job_done=over.get("how") == "done")
            taken = [d for d in decider.decisions() if decider.label in d.hosts and d.attempt not in passed]
            if taken:
                return taken[-1]
            if len(decider.members.alive()) <= 1 and time.monotonic() - started >= start_s:
                return NotCalled(f"no host of the job came within {start_s:g} s of {this}'s start "
                                 f"(init.timeout_s)", job_done=False)
        except EtcdError:
            pass
        time.sleep(decider.every_s)


def come_back(decider: Decider, stopped: list[int], patience_s: float) -> bool:
    """This host, left out while its `run` lived on, in the job's etcd again as a host coming back
    (:meth:`Decider.come_back`), etcd tried for ``patience_s`` (as long as the others take to find a host lost and end
    their shares); False: a signal meanwhile (``stopped``), or etcd refused it (out of reach that long, or a `run` of
    this host typed again holds its place), said why."""
    deadline = time.monotonic() + patience_s
    while not stopped:
        try:
            decider.come_back()
            return True
        except EtcdError as e:
            if time.monotonic() > deadline:
                print(f"manual: this host cannot stand by to be taken back: the job's etcd did not answer: {e}",
                      file=sys.stderr, flush=True)
                return False
        except AlreadyRunning as e:
            print(f"manual: this host cannot stand by to be taken back: {e}", file=sys.stderr, flush=True)
            return False
        time.sleep(decider.every_s)
    return False
