"""What a host agent knows of each of its ranks while it runs, and what it does with that: the end guard, and the
stall watchdog from outside the ranks.

A rank tells its agent the moments of its life on its event channel (runner.training.output): it joined its default
process group, destroyed it, returned (its script or recipe: the process is ending), and, about once a second from
its watch thread, that the watch runs (so the GIL is to be had) and when the rank last made progress. The relay
(runner.worker.relay) keeps them in the rank's :class:`RankLife`; the agent's monitor (runner.worker.host_agent) asks
:class:`EndGuard` about every running rank at each tick.

**The end guard.** A rank whose work is over (it destroyed its process group, or its body returned, or every other rank
of the job has ended well) and which then neither ends nor does anything for :data:`QUIET_S` seconds (its main thread
uses no CPU time at all, and its watch is silent: the GIL is held, or the watch has finished) is stuck at its end: torch's own race, where
``~ProcessGroupGloo`` joins gloo's worker thread while it holds the GIL and that thread waits for the GIL, is the one
seen in ordinary DDP scripts (under torchrun too, where a script imports ``torch._dynamo`` early). The agent says what
it is stuck in (runner.worker.process_state), asks it for its stacks (faulthandler writes them without the GIL), ends
it :data:`STACKS_S` later, and the job's result stands where its work was done. A rank whose watch still runs is
waiting for something of its own (a sleep, input, a file): it is left alone.

**The stall watchdog from outside.** ``launcher.stall_timeout_s`` is rank 0's watch's to enforce, with every rank's
dump; a watch cannot enforce it where the GIL is held, nor once its rank has exited. The agent ends the job itself
when no rank it knows of made progress for ``stall_timeout_s`` + :data:`STALL_MARGIN_S` seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from runner.worker.process_state import Waiting, main_thread_cpu_seconds, what_it_waits_for

QUIET_S = 10.0  # a rank whose work is over that neither ends nor does anything for this long is ended (README)
STACKS_S = 1.0  # a stuck rank is killed this long after it was asked for its stacks
STALL_MARGIN_S = 5.0  # the agent ends a stalled job this long after rank 0's watch would have (it says more)


@dataclass
class RankLife:
    """What one rank said of its life, as its agent heard it (times: ``time.time()``, the host's one clock)."""

    started: float  # the attempt's start
    alive: float | None = None  # its watch last said it runs
    progressed: float | None = None  # it last completed a collective or a progress step
    joined: float | None = None  # it joined its default process group
    destroyed: float | None = None  # it destroyed it
    returned: float | None = None  # its script or recipe returned
    step: int | None = None  # its progress bar's step, from the run's start (runner.training.progress.StepCount)
    resumed: int | None = None  # the step its first bar started at: where a resumed attempt began
    copy_host: str | None = None  # the host whose copy of the checkpoint it resumed from (runner.training.copies)
    copy_save: int | None = None  # that copy's sequence among the run's saves

    def heard(self, event: Mapping[str, object], now: float) -> None:
        """An event from the rank (runner.training.output)."""
        if event.get("k") == "alive":
            self.alive = now
            progressed = event.get("progressed")
            if isinstance(progressed, (int, float)):
                self.progressed = float(progressed)
            for key in ("step", "resumed"):
                if isinstance(event.get(key), int):
                    setattr(self, key, event[key])
        elif event.get("k") == "copy":
            host, save = event.get("host"), event.get("seq")
            self.copy_host = host if isinstance(host, str) else None
            self.copy_save = save if isinstance(save, int) else None
        elif event.get("k") == "life" and event.get("event") in ("joined", "destroyed", "returned"):
            setattr(self, str(event["event"]), now)

    def work_over(self) -> str | None:
        """How the rank's work ended, in words ("destroyed its process group at 2.1 s"); None: not yet."""
        if self.destroyed is not None:
            return f"destroyed its process group at {self.destroyed - self.started:.1f} s"
        if self.returned is not None:
            return f"returned at {self.returned - self.started:.1f} s"
        return None


@dataclass(frozen=True)
class Stuck:
    """A rank the guard found stuck at its end."""

    index: int
    text: str  # "rank 1 destroyed its process group at 2.1 s and did not end (stuck in ...); ended it"
    work_done: bool  # its work was over by its own account (its result stands)


@dataclass
class _Quiet:
    cpu: float
    since: float


@dataclass
class EndGuard:
    """The end guard of one attempt (see the module docstring)."""

    quiet_s: float = QUIET_S
    clock: Callable[[], float] = time.time
    cpu: Callable[[int], float | None] = main_thread_cpu_seconds
    waits_for: Callable[[int], Waiting] = what_it_waits_for
    _quiet: dict[int, _Quiet] = field(default_factory=dict)

    def look(self, index: int, rank: int, pid: int, life: RankLife, peers_ended_at: float | None) -> Stuck | None:
        """Whether rank ``rank`` (the host's ``index``-th, process ``pid``) is stuck at its end. ``peers_ended_at``:
        when the last of every other rank of the job ended well (None: some have not)."""
        over = life.work_over()
        if over is None and peers_ended_at is not None:
            over = f"was still running {self.clock() - peers_ended_at:.0f} s after every other rank had ended"
        if over is None:
            self._quiet.pop(index, None)
            return None
        now = self.clock()
        used = self.cpu(pid)
        quiet = self._quiet.get(index)
        if used is None or quiet is None or used != quiet.cpu or (life.alive is not None and life.alive > quiet.since):
            self._quiet[index] = _Quiet(used if used is not None else -1.0, now)  # it did something: watch again
            return None
        if now - quiet.since < self.quiet_s:
            return None
        del self._quiet[index]
        waits = self.waits_for(pid)
        how = "stuck" + (f" in {waits.place}" if waits.place else "") + (f": {waits.detail}" if waits.detail else "")
        watch = "its watch had finished" if life.returned is not None else "its watch could not run: the GIL is held"
        verb = "and did not end" if life.work_over() else "without ending"
        text = (f"rank {rank} {over} {verb} ({how}; its main thread used no CPU time for {now - quiet.since:.0f} s, "
                f"and {watch}); ended it")
        return Stuck(index, text, work_done=life.work_over() is not None)


def stalled(lives: Mapping[int, RankLife], beats: Mapping[int, float], stall_timeout_s: float | None,
            now: float) -> float | None:
    """The agent's stall watchdog: seconds since the last progress any rank made (its own ranks' ``lives``, the other
    hosts' ``beats`` from the job's channel) or since its ranks joined their process group (forming it is no stall:
    init.timeout_s bounds that), once that is ``stall_timeout_s`` + :data:`STALL_MARGIN_S` or more; else None."""
    joined = [life.joined for life in lives.values() if life.joined is not None]
    if stall_timeout_s is None or not joined:
        return None
    seen = [life.progressed for life in lives.values() if life.progressed is not None]
    quiet = now - max([*joined, *seen, *beats.values()])
    return quiet if quiet >= stall_timeout_s + STALL_MARGIN_S else None
