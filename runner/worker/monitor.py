"""A host agent's **monitor**: what happened to an attempt since the last look, as events for its state machine
(runner.worker.attempt_state). Each source only reads (the zygote's word that a rank exited, the agent's inbox, the
job's channel, the ranks' error files and their lives as the relay heard them, /proc) and returns events; what is
to be done about them is the machine's to say and the executor's to do (runner.worker.executor).

The sources are read in a fixed order, each once the events of the one before were handled: what a source looks at
depends on the phase those left (a stopping attempt looks for no stall, no rank stuck at its end, no other host's
failure). A source that reads something costly or remote (the job's channel, the run folder's request for dumps,
the other hosts' heartbeats) looks at most every :data:`PEER_POLL_S`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from runner.records.outcomes import timed_out
from runner.records.watch_files import last_request
from runner.worker.attempt_state import (AttemptState, DumpsRequested, EndedFromOutside, Event, PeerFailed, Phase,
                                         RankExited, Signalled, StallSeen, StepSeen, StuckAtEnd, Tick, TimedOut,
                                         WhereAsked)
from runner.worker.inbox import AgentInbox
from runner.worker.rank_life import EndGuard, RankLife, stalled
from runner.worker.running import Running

PEER_POLL_S = 0.5  # how often the job's channel is looked at: another host's failure, a stop request

Source = Callable[[AttemptState], list[Event]]


class Monitor:
    """The event sources of one attempt (see the module docstring). ``reports_steps``: someone asked for rank 0's
    step (runner.worker.agent_reports); ``clock``: the monotonic clock the polls are timed by, ``wall``: the host's
    clock the ranks' lives are told in."""

    def __init__(self, running: Running, inbox: AgentInbox, *, reports_steps: bool = False,
                 guard: EndGuard | None = None, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.running = running
        self.inbox = inbox
        self.reports_steps = reports_steps
        self.guard = guard if guard is not None else EndGuard()
        self.clock, self.wall = clock, wall
        self._channel_polled = clock()  # the poll timers: when each was last looked at
        self._requests_polled = 0.0
        self._beats_read = 0.0
        self._last_of_rank_0: RankLife | None = None  # rank 0's life as its exit left it (its pipes drained)

    def sources(self) -> tuple[Source, ...]:
        """Every source, in the order the machine takes their events."""
        return (self.exits, self.signals, self.where_asked, self.ends, self.channel_news, self.timed_out,
                self.dump_requests, self.stuck_at_end, self.stall, self.step, self.tick)

    def exits(self, state: AttemptState) -> list[Event]:
        """The ranks whose process ended (the zygote said so), with whether each said its work returned first; what
        each left in its pipes is taken now (the relay's last read of it)."""
        a, exited = self.running, []
        for rank in a.ranks:
            number = a.number(rank)
            if number not in state.ending.codes and rank.reap() is not None:
                life = a.relay.life(rank.index)
                exited.append(RankExited(rank=number, code=rank.code, at=self.wall(),
                                         returned_at=life.returned if life is not None else None))
                a.relay.drain(rank.index)
                if number == 0:
                    self._last_of_rank_0 = life  # its last step, which the drain read: for :meth:`step`
        return exited

    def signals(self, _state: AttemptState) -> list[Event]:
        return [Signalled(signum=signum) for signum in self.inbox.take_signals()]

    def where_asked(self, _state: AttemptState) -> list[Event]:
        return [WhereAsked()] if self.inbox.take_where() else []

    def ends(self, _state: AttemptState) -> list[Event]:
        return [EndedFromOutside(failure=failure) for failure in self.inbox.take_ends()]

    def channel_news(self, state: AttemptState) -> list[Event]:
        """Another host's `run` asked to stop (Ctrl-C, SIGTERM, the stop signal; a request not seen yet), or another
        host's rank failed (while this attempt runs)."""
        channel, now = self.running.channel, self.clock()
        if channel is None or now - self._channel_polled < PEER_POLL_S:
            return []
        self._channel_polled = now
        news: list[Event] = []
        asked = channel.stop_requested()
        if asked is not None and asked != state.stop_seen:
            news.append(Signalled(signum=asked.signal, origin=asked.host, asked=asked))
        failure = channel.failure(self.running.paths.attempt) if state.phase is Phase.RUNNING else None
        if failure is not None:  # end this host's share, restart together
            news.append(PeerFailed(failure=failure))
        return news

    def timed_out(self, state: AttemptState) -> list[Event]:
        """A rank's collective timed out (its error file says so), until the ranks still running were asked for
        their stacks."""
        if state.stacks_asked or state.phase is not Phase.RUNNING:
            return []
        a = self.running
        failed = [s for s in a.setups if s.outcome.failed]
        if not any(timed_out(e) for s in failed if (e := s.outcome.error()) is not None):
            return []
        running = tuple(s.place.global_rank for s in a.setups if s not in failed and not s.outcome.done)
        return [TimedOut(running=running)]

    def dump_requests(self, _state: AttemptState) -> list[Event]:
        """The last request for the ranks' dumps (Ctrl-\\, a timeout, a stop, a stall): the job's channel's, else the
        run folder's."""
        now = self.clock()
        if now - self._requests_polled < PEER_POLL_S:
            return []
        self._requests_polled = now
        a = self.running
        asked = a.channel.dump_request() if a.channel is not None else None
        at, reason = (asked.time, asked.reason) if asked else (last_request(a.paths), "request")
        return [DumpsRequested(at=float(at), reason=str(reason or "request"))] if at is not None else []

    def stuck_at_end(self, state: AttemptState) -> list[Event]:
        """The end guard (runner.worker.rank_life): the ranks stuck at their end, while the attempt runs."""
        if state.phase is not Phase.RUNNING:
            return []
        a, ending, stuck = self.running, state.ending, []
        whole_job = len(a.setups) == a.plan.world_size  # every other rank's end is known here
        for rank in a.ranks:
            number = a.number(rank)
            life = a.relay.life(rank.index)
            if rank.code is not None or number in ending.stuck or life is None:
                continue
            others = [r for r in state.ranks if r != number]
            peers = max(ending.ended_at[r] for r in others) if whole_job and others and all(
                ending.codes.get(r) == 0 for r in others) else None
            found = self.guard.look(rank.index, number, rank.pid, life, peers)
            if found is not None:
                stuck.append(StuckAtEnd(rank=number, stuck=found, stacks=str(a.setups[rank.index].log_file)))
        return stuck

    def stall(self, state: AttemptState) -> list[Event]:
        """The stall watchdog from outside the ranks (runner.worker.rank_life.stalled): no rank here, nor (their
        heartbeats on the job's channel) on another host, made progress for launcher.stall_timeout_s and a margin."""
        a = self.running
        timeout_s = a.plan.job.spec.launcher.stall_timeout_s
        if timeout_s is None or state.phase is not Phase.RUNNING:
            return []
        lives = {r.index: life for r in a.ranks if r.code is None and (life := a.relay.life(r.index)) is not None}
        beats: dict[int, float] = {}
        now = self.wall()
        if a.channel is not None and len(a.setups) < a.plan.world_size and now - self._beats_read >= PEER_POLL_S:
            self._beats_read = now
            beats = {r: b for r in range(a.plan.world_size) if (b := a.channel.beat(r)) is not None}
        quiet = stalled(lives, beats, timeout_s, now)
        return [StallSeen(quiet_s=quiet)] if quiet is not None else []

    def step(self, _state: AttemptState) -> list[Event]:
        """Rank 0's progress bar's step, where rank 0 is here and someone asked for it."""
        if not self.reports_steps:
            return []
        a = self.running
        rank_0 = next((r for r in a.ranks if a.number(r) == 0), None)
        life = a.relay.life(rank_0.index) if rank_0 is not None else None
        final = life is None and self._last_of_rank_0 is not None  # rank 0 exited: its last step, once
        if final:
            life, self._last_of_rank_0 = self._last_of_rank_0, None
        if life is None or life.step is None:
            return []
        return [StepSeen(step=life.step, resumed=life.resumed, copy_host=life.copy_host, copy_save=life.copy_save,
                         final=final)]

    def tick(self, _state: AttemptState) -> list[Event]:
        return [Tick()]
