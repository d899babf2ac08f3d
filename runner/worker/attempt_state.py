"""One attempt of a host's share as a state machine: where it is (:class:`Phase`), the events that move it, and
what the host agent is to do about each (the directives). torch elastic's agent is the model (its ``WorkerState``
and the loop of ``_invoke_run``); here one handler, :meth:`AttemptState.handle`, takes every event, in the order
the agent's monitor sees them, and nothing else changes the phase. It does no input or output: the monitor
(runner.worker.monitor) reads the ranks, the signals and the job's channel into events, and the executor
(runner.worker.executor) carries out what the handler returns: signals to send, lines to say, the job's channel to
tell, the ranks' dumps to ask and answer for, a stall to diagnose, reports to whoever started the agent. An effect
whose result the attempt needs (the failure the channel names first, a stall's diagnosis) comes back as an event.
So a test sends events and reads the transitions and the directives.

Everything the attempt remembers is here (the machine's fields), not beside it: which stop request of the job's
channel it has seen, whether it asked for the ranks' stacks after a timeout, the last request for dumps answered for
the ranks that cannot answer, and the step of rank 0 last reported.

Ranks are named by their global rank everywhere here, as in :class:`~runner.worker.host_ending.HostEnding`, the
record the state keeps of how they ended.
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

from runner.worker.channel_records import JobFailure, StopAsked
from runner.worker.host_ending import HostEnding
from runner.worker.rank_life import STACKS_S, Stuck
from runner.worker.rank_process import STACK_SIGNAL

FAILURE_STOP_S = 5.0  # after a rank failed: how long the others have to end on SIGTERM before SIGKILL
HARD_STOP_MARGIN_S = 10.0  # after launcher.grace_s and the failure stop: a share that stops on its own (its launch gone)
# had its agent's chance to stop its ranks; whatever still runs then ends with its process
STEP_REPORT_S = 1.0  # rank 0's step is reported at most this often (its first step of an attempt at once)


class Phase(enum.Enum):
    """Where one attempt of a host's share is. Its transitions (and only these):

    - RUNNING -> STOPPING: a rank here failed by itself, another host's rank failed (the job's channel), the job was
      ended from outside (a host lost), the stall watchdog fired, or a SIGINT or SIGTERM reached the agent (or
      another host's `run`): the running ranks are sent what the cause sends, with a deadline;
    - RUNNING -> ENDED: every rank exited by itself (or after a stop request, which keeps the attempt RUNNING: its
      ranks checkpoint and return);
    - STOPPING -> KILLED: the deadline passed: SIGKILL to every rank's process group;
    - STOPPING -> ENDED, KILLED -> ENDED: every rank's exit was seen.

    A rank stuck at its end (the end guard) is killed by itself, whatever the phase: the attempt stays RUNNING.
    """

    RUNNING = "running"
    STOPPING = "stopping"
    KILLED = "killed"
    ENDED = "ended"


# -- events ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Started:
    """The attempt's ranks were all started."""


@dataclass(frozen=True, kw_only=True)
class RankExited:
    """A rank's process ended (the zygote said so): its exit status (-N: killed by signal N), when the agent saw
    it (``at``, wall clock), and when it said its script or recipe returned, if it did."""

    rank: int
    code: int
    at: float
    returned_at: float | None = None


@dataclass(frozen=True, kw_only=True)
class Signalled:
    """SIGINT, SIGTERM or the stop signal reached the agent, or (``origin``: that host's) another host's `run`;
    ``asked``: the job's channel's record of it, where it was read there."""

    signum: int
    origin: str | None = None
    asked: StopAsked | None = None


@dataclass(frozen=True, kw_only=True)
class StopSeen:
    """What the job's channel says of the last stop request, read back after this host put its own there."""

    asked: StopAsked | None


@dataclass(frozen=True, kw_only=True)
class PeerFailed:
    """The job's channel says another host's rank failed (or another host's agent ended its attempt)."""

    failure: JobFailure


@dataclass(frozen=True, kw_only=True)
class EndedFromOutside:
    """The job was ended for a cause no rank can see (launcher=ssh lost a host): :meth:`HostAgent.end_job`."""

    failure: JobFailure


@dataclass(frozen=True, kw_only=True)
class StallSeen:
    """The agent's stall watchdog found no progress on any rank for ``quiet_s`` (runner.worker.rank_life.stalled):
    to be diagnosed (the ranks' dumps) before the attempt fails with it."""

    quiet_s: float


@dataclass(frozen=True, kw_only=True)
class Stalled:
    """The stall, diagnosed: the attempt's failure."""

    failure: JobFailure


@dataclass(frozen=True, kw_only=True)
class FirstFailureWas:
    """What the job's channel names as the attempt's first failure, read back after this host told its own."""

    failure: JobFailure


@dataclass(frozen=True, kw_only=True)
class StuckAtEnd:
    """The end guard found a rank stuck at its end (runner.worker.rank_life.EndGuard); ``stacks``: where its stacks
    go (its log)."""

    rank: int
    stuck: Stuck
    stacks: str = ""


@dataclass(frozen=True, kw_only=True)
class TimedOut:
    """A rank's collective timed out (its error file says so; it waits a moment before exiting): ``running``, the
    ranks here still running, whose stacks show where the ranks it waited for were."""

    running: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class DumpsRequested:
    """Every rank was asked where it is (Ctrl-\\, a timeout, a stop, a stall: the job's channel or the run folder),
    at ``at``."""

    at: float
    reason: str


@dataclass(frozen=True, kw_only=True)
class DumpsAnswered:
    """This agent asked the ranks where they are at ``at`` itself, and answered for those that cannot."""

    at: float


@dataclass(frozen=True, kw_only=True)
class WhereAsked:
    """Where every rank of every host is, asked of this agent (:meth:`HostAgent.ask_where`)."""


@dataclass(frozen=True, kw_only=True)
class StepSeen:
    """Rank 0's progress bar's step (it runs on this host), with where its attempt resumed and from whose copy."""

    step: int
    resumed: int | None = None
    copy_host: str | None = None
    copy_save: int | None = None
    final: bool = False  # rank 0 has exited: its last step, said whenever it comes (a join's record needs it)


@dataclass(frozen=True, kw_only=True)
class Tick:
    """A look at the clock: a deadline may have passed."""


Event = (Started | RankExited | Signalled | StopSeen | PeerFailed | EndedFromOutside | StallSeen | Stalled
         | FirstFailureWas | StuckAtEnd | TimedOut | DumpsRequested | DumpsAnswered | WhereAsked | StepSeen | Tick)


# -- directives ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Send:
    """Send ``signum`` to these ranks' processes (``group``: to each one's process group)."""

    signum: int
    ranks: tuple[int, ...]
    group: bool = False


@dataclass(frozen=True, kw_only=True)
class Say:
    """A line on the agent's stderr."""

    text: str


@dataclass(frozen=True, kw_only=True)
class TellOwnFailure:
    """Tell the other hosts (the job's channel) that this host's ``rank`` failed, then read which failure the channel
    names first (:class:`FirstFailureWas`, where it is another)."""

    rank: int


@dataclass(frozen=True, kw_only=True)
class TellFailure:
    """Put ``failure`` on the job's channel; ``read_back``: then read which one the channel names first."""

    failure: JobFailure
    read_back: bool


@dataclass(frozen=True, kw_only=True)
class TellStop:
    """Put the signal that reached this agent on the job's channel, so that every other host passes it on as if its
    own `run` had got it; then read the channel's record of it back (:class:`StopSeen`)."""

    signum: int


@dataclass(frozen=True, kw_only=True)
class SayWhereTheyWere:
    """The grace after a SIGINT or SIGTERM is over: say where the ranks still running are, before they are killed."""

    signum: int


@dataclass(frozen=True, kw_only=True)
class SayWhereTheRanksAre:
    """Say where every rank of every host is, in one paragraph (runner.reports.where)."""


@dataclass(frozen=True, kw_only=True)
class AnswerForTheSilent:
    """The ranks here that cannot answer a request for dumps made at ``at`` get an answer from their agent."""

    at: float
    reason: str


@dataclass(frozen=True, kw_only=True)
class DiagnoseStall:
    """Ask every rank where it is, diagnose the stall from their dumps and write the diagnosis; then
    :class:`Stalled`."""

    quiet_s: float


@dataclass(frozen=True, kw_only=True)
class ReportBegan:
    """Tell whoever started the agent that the attempt began (runner.worker.agent_reports.AttemptBegan)."""


@dataclass(frozen=True, kw_only=True)
class ReportStep:
    """Tell whoever started the agent rank 0's step (runner.worker.agent_reports.StepReached)."""

    seen: StepSeen


Directive = (Send | Say | TellOwnFailure | TellFailure | TellStop | SayWhereTheyWere | SayWhereTheRanksAre
             | AnswerForTheSilent | DiagnoseStall | ReportBegan | ReportStep)


@dataclass
class AttemptState:
    """One attempt of a host's ranks (``ranks``: their global ranks), from their start to the last one's exit.
    ``scripts``: they run a script (a SIGTERM reaches them as SIGTERM, and the stop request as SIGTERM too), else a
    recipe; ``stop_signal``: the recipes' stop request (launcher.stop_signal); ``grace_s``: how long ranks have after a
    SIGINT or SIGTERM (launcher.grace_s). Times (``now``, the deadlines) are the monotonic clock's. ``stop_seen``: the
    channel's stop request when the attempt began (an earlier attempt's is no new one); ``answered``: the last request
    for dumps answered already (the agent's, over its attempts: the run folder's request stays)."""

    ranks: tuple[int, ...]
    scripts: bool
    stop_signal: int
    grace_s: float
    phase: Phase = Phase.RUNNING
    deadline: float | None = None  # STOPPING: when what is left is killed
    ending: HostEnding = field(default_factory=lambda: HostEnding(codes={}, order=[]))
    stuck_kill_at: dict[int, float] = field(default_factory=dict)  # a stuck rank -> when it is killed
    killed: set[int] = field(default_factory=set)  # the ranks this agent sent SIGKILL
    stop_seen: StopAsked | None = None  # the last stop request seen on the job's channel
    stacks_asked: bool = False  # after a collective timed out, the late ranks were asked for their stacks
    answered: float = 0.0  # the last request for dumps answered for the ranks that cannot (runner.worker.rank_life)
    step_said: int | None = None  # rank 0's step, as last reported
    step_said_at: float = float("-inf")
    first_step_said: bool = False

    def __post_init__(self) -> None:
        if not self.ranks:
            self.phase = Phase.ENDED

    @property
    def running(self) -> tuple[int, ...]:
        """The ranks whose exit has not been seen."""
        return tuple(r for r in self.ranks if r not in self.ending.codes)

    def handle(self, event: Event, now: float) -> list[Directive]:
        """Take one event at ``now``: the phase it moves to (see :class:`Phase`) and what the agent is to do."""
        handlers: dict[type, Callable[[Event, float], list[Directive]]] = {
            Started: lambda _e, _n: [ReportBegan()],
            RankExited: self._exited, Signalled: self._signalled, StopSeen: self._stop_seen,
            PeerFailed: self._failed_elsewhere, EndedFromOutside: self._failed_elsewhere, Stalled: self._failed_elsewhere,
            StallSeen: self._stall_seen, FirstFailureWas: self._first_failure_was, StuckAtEnd: self._stuck_at_end,
            TimedOut: self._timed_out, DumpsRequested: self._dumps_requested, DumpsAnswered: self._dumps_answered,
            WhereAsked: lambda _e, _n: [SayWhereTheRanksAre()], StepSeen: self._step_seen, Tick: self._tick}
        return handlers[type(event)](event, now)

    # -- the handlers, one per kind of event ------------------------------------------------------------------------
    def _exited(self, event: RankExited, now: float) -> list[Directive]:
        ending = self.ending
        if event.rank in ending.codes or event.rank not in self.ranks:
            return []
        ending.codes[event.rank] = event.code
        ending.order.append(event.rank)
        if event.code == -signal.SIGKILL and event.rank not in self.killed:
            # killed, though not by this agent: it ended before the stop that another rank's failure sent it arrived
            # (its exit seen late), and is a failure of its own, not a rank stopped
            ending.stopped.discard(event.rank)
        ending.ended_at[event.rank] = event.at
        if event.returned_at is not None:
            ending.returned_at[event.rank] = event.returned_at
        said: list[Directive] = []
        if self.phase is Phase.RUNNING and ending.failed_by_itself():  # the others end now; the other hosts are told
            said = [TellOwnFailure(rank=ending.first_failure()), *self._stop(signal.SIGTERM, now + FAILURE_STOP_S)]
        if not self.running:
            self.phase, self.deadline = Phase.ENDED, None
        return said

    def _signalled(self, event: Signalled, now: float) -> list[Directive]:
        """A signal that reached this agent goes on the job's channel too (every host passes it on), whatever it does
        here; one read there is remembered (it is not new the next time the channel is looked at)."""
        if event.asked is not None:
            self.stop_seen = event.asked
        said = self._passed_on(event, now)
        return said if event.origin is not None else [*said, TellStop(signum=event.signum)]

    def _passed_on(self, event: Signalled, now: float) -> list[Directive]:
        """SIGINT reaches the ranks as SIGINT; SIGTERM as SIGTERM to a script and as the stop request to a recipe, both
        with launcher.grace_s to end; the stop signal as the stop request (a script's SIGTERM), with no deadline."""
        ending, signum = self.ending, event.signum
        name = signal.Signals(signum).name + (f" (to {event.origin}'s `run`)" if event.origin else "")
        if signum in (signal.SIGINT, signal.SIGTERM):
            if ending.signum is not None:
                return []  # Ctrl-C reaches `run` and the agent both, and `run` passes its own on: once is enough
            ending.signum = signum
            running = len(self.running)
            if signum == signal.SIGTERM and not self.scripts:
                said = Say(text=f"\n{name}: asking {running} process(es) to checkpoint and stop (the stop request; "
                                f"launcher.grace_s={self.grace_s:g})")
                sent = self.stop_signal
            else:
                said, sent = Say(text=f"\n{name}: stopping {running} process(es)"), signum
            deadline = now + max(0.0, float(self.grace_s))
            return [said, *self._stop(sent, min(deadline, self.deadline if self.deadline is not None else deadline))]
        if ending.requested:
            return []  # passed on already (this host's signal, then the same request read from the channel)
        running = self.running
        ending.requested = True
        if self.scripts:
            ending.stopped.update(running)
        return [Say(text=f"\n{name}: asking {len(running)} process(es) to checkpoint and stop"
                         + (" (SIGTERM to the script)" if self.scripts else "")),
                Send(signum=signal.SIGTERM if self.scripts else self.stop_signal, ranks=running)]

    def _stop_seen(self, event: StopSeen, _now: float) -> list[Directive]:
        self.stop_seen = event.asked
        return []

    def _failed_elsewhere(self, event: PeerFailed | EndedFromOutside | Stalled, now: float) -> list[Directive]:
        """Another host's failure, the job ended from outside, or a stall: this host's ranks end too (unless they are
        ending already), and the attempt fails with that cause."""
        if self.phase is not Phase.RUNNING:
            return []
        self.ending.peer_failed = event.failure
        told: list[Directive] = []
        if not isinstance(event, PeerFailed):  # the channel says it already where another host's rank failed
            told = [TellFailure(failure=event.failure, read_back=isinstance(event, EndedFromOutside))]
        return [*told, *self._stop(signal.SIGTERM, now + FAILURE_STOP_S)]

    def _first_failure_was(self, event: FirstFailureWas, _now: float) -> list[Directive]:
        """The channel names another failure first: the attempt's cause is that one (another host's rank failed
        before this host's, whose peer connection then closed)."""
        ending, failure = self.ending, event.failure
        if ending.peer_failed is not None:
            ending.peer_failed = failure
        elif failure.rank != ending.first_failure():
            ending.earlier = failure
        return []

    def _stall_seen(self, event: StallSeen, _now: float) -> list[Directive]:
        """No progress: diagnosed first (the diagnosis comes back as :class:`Stalled`), unless the attempt is ending
        already."""
        return [DiagnoseStall(quiet_s=event.quiet_s)] if self.phase is Phase.RUNNING else []

    def _stuck_at_end(self, event: StuckAtEnd, now: float) -> list[Directive]:
        """Said, its stacks asked for (faulthandler writes them without the GIL), and killed :data:`STACKS_S` later."""
        self.ending.stuck[event.rank] = event.stuck
        self.stuck_kill_at[event.rank] = now + STACKS_S
        return [Say(text=f"\n{event.stuck.text} (its stacks: {event.stacks})"),
                Send(signum=STACK_SIGNAL, ranks=(event.rank,))]

    def _timed_out(self, event: TimedOut, _now: float) -> list[Directive]:
        """A collective timed out: the ranks still running are asked for their stacks, once an attempt."""
        if self.stacks_asked or self.phase is not Phase.RUNNING:
            return []
        self.stacks_asked = True
        return [Send(signum=STACK_SIGNAL, ranks=event.running)] if event.running else []

    def _dumps_requested(self, event: DumpsRequested, _now: float) -> list[Directive]:
        """A request not answered yet: answered for the ranks here that cannot."""
        if event.at <= self.answered:
            return []
        self.answered = event.at
        return [AnswerForTheSilent(at=event.at, reason=event.reason)]

    def _dumps_answered(self, event: DumpsAnswered, _now: float) -> list[Directive]:
        self.answered = max(self.answered, event.at)
        return []

    def _step_seen(self, event: StepSeen, now: float) -> list[Directive]:
        """Rank 0's step, when it moved: at once the first step of the attempt and rank 0's last, else at most every
        :data:`STEP_REPORT_S`."""
        if event.step == self.step_said:
            return []
        first = event.resumed is not None and event.step > event.resumed and not self.first_step_said
        if not first and not event.final and now - self.step_said_at < STEP_REPORT_S:
            return []
        self.step_said, self.step_said_at, self.first_step_said = event.step, now, self.first_step_said or first
        return [ReportStep(seen=event)]

    def _tick(self, _event: Tick, now: float) -> list[Directive]:
        said: list[Directive] = []
        for rank, at in list(self.stuck_kill_at.items()):
            if now >= at:
                del self.stuck_kill_at[rank]
                if rank in self.running:
                    self.killed.add(rank)
                    said.append(Send(signum=signal.SIGKILL, ranks=(rank,), group=True))
        if self.phase is Phase.STOPPING and self.deadline is not None and now >= self.deadline:
            if self.ending.signum is not None and self.ending.peer_failed is None:
                said.append(SayWhereTheyWere(signum=self.ending.signum))
            self.killed.update(self.ranks)
            said.append(Send(signum=signal.SIGKILL, ranks=self.ranks, group=True))  # their children too
            self.phase, self.deadline = Phase.KILLED, None
        return said

    def _stop(self, signum: int, deadline: float) -> list[Directive]:
        """Ask every running rank to end with ``signum`` by ``deadline``: RUNNING (or STOPPING) -> STOPPING."""
        running = self.running
        self.ending.stopped.update(running)
        if self.phase in (Phase.RUNNING, Phase.STOPPING) and running:
            self.phase, self.deadline = Phase.STOPPING, deadline
        return [Send(signum=signum, ranks=running)] if running else []
