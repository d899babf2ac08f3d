"""What a host agent says of where its ranks are, carried out only when its attempt's state machine says so
(runner.worker.attempt_state's directives, through runner.worker.executor):

- **the silent ranks**: a rank whose watch has not run for :data:`SILENT_S` cannot answer a request for dumps (the GIL
  is held); its agent writes a dump for it, saying what its threads do (runner.worker.process_state, read from
  /proc);
- **where the ranks are** (Ctrl-\\ to `run`, passed to host 0's agent): asked through the job's channel, said in one
  paragraph (runner.reports.where);
- **a stall** the ranks' watches could not report: every rank asked, the hang diagnosed from their dumps
  (runner.reports.hangs), the diagnosis written into the run folder; the attempt's failure;
- **where they were**: ranks still running launcher.grace_s after a SIGINT or SIGTERM, before they are killed.

Each asks the ranks for their dumps itself and answers for its silent ones; it returns when it asked, so that the
attempt does not answer the same request again.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from runner.common.polling import poll
from runner.records.dumps import DUMP_WAIT_STOP_S, RankDump
from runner.records.paths import RunPaths
from runner.records.watch_files import RankWatchFiles, write_diagnosis
from runner.reports.hangs import diagnose, stuck_ranks
from runner.reports.where import where_the_ranks_are
from runner.worker.channel import ask_for_dumps, gather_dumps, where_through
from runner.worker.channel_records import JobFailure
from runner.worker.process_state import Waiting, what_it_waits_for
from runner.worker.running import Running

SILENT_S = 2.0  # a rank whose watch has not run for this long cannot answer where it is: its agent answers for it
STOP_TOLD_WAIT_S = 10.0  # how long another host's agent waits at most for host 0's to have said so, before killing


@dataclass(frozen=True)
class Diagnostics:
    """The diagnostics of one attempt's ranks (see the module docstring)."""

    running: Running
    clock: Callable[[], float] = time.time
    waits_for: Callable[[int], Waiting] = what_it_waits_for

    def speak_for_the_silent(self, reason: str, asked: float) -> None:
        """A dump for each running rank here whose watch has not run for :data:`SILENT_S` (the GIL is held: it cannot
        answer), saying what its threads do (runner.worker.process_state)."""
        a = self.running
        now = self.clock()
        for rank in a.ranks:
            life = a.relay.life(rank.index) if rank.code is None else None
            if life is None or now - (life.alive if life.alive is not None else life.started) < SILENT_S:
                continue
            waits = self.waits_for(rank.pid)
            quiet = now - (life.alive if life.alive is not None else life.started)
            said = f"its watch has not run for {quiet:.0f} s (the GIL is held)" + (
                f"; stuck in {waits.place}" if waits.place else "") + (f": {waits.detail}" if waits.detail else "")
            place = a.setups[rank.index].place
            dump = RankDump(place.global_rank, place.host, now, reason, "host agent", stuck=said)
            RankWatchFiles(a.paths, place.global_rank).write_dump(dump)
            if a.channel is not None:
                a.channel.put_dump(place.global_rank, dump.document())

    def where_the_ranks_are(self) -> float | None:
        """Ctrl-\\: where every rank is, asked through the job's channel; this agent answers for its silent ranks.
        When it asked."""
        through = where_through(self.running.channel)
        asked_at: list[float] = []

        def ask_and_answer(paths: RunPaths, reason: str) -> float:
            asked = through["ask"](paths, reason)
            asked_at.append(asked)
            self.speak_for_the_silent(reason, asked)
            return asked

        where_the_ranks_are(self.running.plan, self.running.paths, ask=ask_and_answer, gather=through["gather"])
        return asked_at[-1] if asked_at else None

    def stall(self, quiet_s: float) -> tuple[float, JobFailure]:
        """The stall watchdog from outside the ranks found no progress for ``quiet_s``: say where the ranks are, and
        fail the attempt with that (as rank 0's watch does where it can). When it asked, and the failure."""
        a = self.running
        world, timeout_s = a.plan.world_size, a.plan.job.spec.launcher.stall_timeout_s
        asked = ask_for_dumps(a.paths, a.channel, "stall")
        self.speak_for_the_silent("stall", asked)
        dumps = gather_dumps(a.paths, a.channel, range(world), asked, DUMP_WAIT_STOP_S)
        found = diagnose(dumps, world)
        said = found.text if found else stuck_ranks(dumps)
        text = (f"stall: no rank completed a collective or a progress step for {quiet_s:.0f} s "
                f"(launcher.stall_timeout_s={timeout_s:g}; seen by the host agent: rank 0's watch could not say it)"
                + (f": {said}" if said else ""))
        write_diagnosis(a.paths, "stall", text, found.document() if found else None)
        return asked, JobFailure(rank=None, host=a.host, text=text, stall=True)

    def where_they_were(self, signum: int) -> tuple[float, str] | None:
        """Ranks still running launcher.grace_s after a SIGINT or SIGTERM: where they are, before they are killed.
        When it asked, and the line that says it (None: no rank was left)."""
        a = self.running
        left = [a.number(r) for r in a.ranks if r.code is None]
        if not left:
            return None
        channel, paths, world = a.channel, a.paths, a.plan.world_size
        asked = ask_for_dumps(paths, channel, "stop")  # every host asks at its grace's end: the same moment
        self.speak_for_the_silent("stop", asked)
        if a.serves or channel is None:  # every rank of every host (the others' grace may end a little later)
            dumps = gather_dumps(paths, channel, range(world), asked, DUMP_WAIT_STOP_S)
            found = diagnose(dumps, world)
            said = found.text if found is not None else stuck_ranks(dumps)
            where = f": {said}" if said else ""
            if channel is not None:
                channel.say_stop_told(asked)
        else:  # host 0's agent says where every rank was, once (under mpirun and Slurm, in the same stream):
            gather_dumps(paths, channel, left, asked, DUMP_WAIT_STOP_S)  # its ranks answer before they are killed
            # and they are killed once it has (host 0's SIGTERM may come later on a busy machine: killing them
            # first would fail host 0's ranks in their collectives, a failure in place of the stop's story)
            poll(channel.stop_told, bool, STOP_TOLD_WAIT_S)
            where = " (host 0's agent says where every rank was)"
        return asked, (f"{signal.Signals(signum).name}: rank(s) {', '.join(map(str, left))} still running "
                       f"launcher.grace_s={a.plan.job.spec.launcher.grace_s:g} s after it; killing them{where}")
