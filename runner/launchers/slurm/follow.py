"""Following a submitted Slurm job to its end: its state changes and its output as they come, then its exit status.

Two clocks. The job's output file is copied to the terminal every :data:`TAIL_S` (rank 0's progress keeps coming).
Slurm is asked for the job's state on a schedule that backs off (:class:`PollSchedule`): every second at first and
after each change of state, then less and less often while the job stays in one state, at most every
:data:`LONGEST_S` — an hour-long job costs slurmctld and slurmdbd about 150 calls, not 3,600, and a job that ends
after a minute in its state is still seen within 6 s. (submitit's watcher backs off too: half the time since the
job was submitted, from 2 s up to a minute.)

Signals to `run` meanwhile: Ctrl-C or SIGTERM cancels the job; the stop signal (the plan's, launcher.slurm.signal) is
passed on to the job's batch script, whose trap passes it to the ranks (they checkpoint and return), after `run` has
written the run's user-stop marker, so that the script ends the job rather than requeueing it.
"""

from __future__ import annotations

import shlex
import signal
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TextIO

from runner.common import exits
from runner.common.signals import handling
from runner.launchers.slurm.job import (JobStatus, SlurmStates, ask_to_stop, exit_status, mark_user_stop, scancel,
                                        stop_command)

TAIL_S = 1.0  # the output file is copied this often, whatever the state polls do
FIRST_S = 1.0  # the state is asked this soon after a change (and at the start)
LONGEST_S = 30.0  # ... and at least this often
FRACTION = 0.1  # in between: a tenth of the time the job has been in its state


class PollSchedule:
    """When to ask for a job's state next: :data:`FIRST_S` after a change, then :data:`FRACTION` of the time since
    the last change, at most :data:`LONGEST_S`."""

    def __init__(self, first_s: float = FIRST_S, longest_s: float = LONGEST_S, fraction: float = FRACTION) -> None:
        self.first_s, self.longest_s, self.fraction = first_s, longest_s, fraction
        self.changed_at: float | None = None  # when what was asked last changed; None: not asked yet
        self.next_at = float("-inf")  # when to ask again: at once, to begin with

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def asked(self, now: float, changed: bool) -> None:
        """The state was asked at ``now``; ``changed``: it differs from the last answer."""
        if changed or self.changed_at is None:
            self.changed_at = now
        self.next_at = now + min(self.longest_s, max(self.first_s, self.fraction * (now - self.changed_at)))

    def hurry(self, now: float) -> None:
        """Something is about to change (the job was cancelled): ask again soon."""
        self.changed_at = now
        self.next_at = min(self.next_at, now + self.first_s)


class _Tail:
    """Copies what a file gains to a stream (the job's output file, as it is written on the nodes)."""

    def __init__(self, path: Path, stream: TextIO) -> None:
        self.path, self.stream, self.offset = path, stream, 0

    def pump(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        if data:
            self.offset += len(data)
            self.stream.write(data.decode(errors="replace"))
            self.stream.flush()


CANCELS = (signal.SIGINT, signal.SIGTERM)  # to `run`: cancel what it follows


def pass_on_stop(signum: int, job_ids: list[str], markers: Iterable[Path], what: str,
                 stop: Callable[[list[str], int], str | None] = ask_to_stop) -> None:
    """The stop signal to `run`, passed on to jobs it follows (``what``: them, as `run`'s line names them): their
    user-stop markers first (the batch script then ends its job rather than requeueing it), then the signal to their
    batch scripts (:func:`runner.launchers.slurm.job.ask_to_stop`); what was done, and what Slurm refused, on stderr."""
    name, command = signal.Signals(signum).name, shlex.join(stop_command(job_ids, signum))
    try:
        mark_user_stop(markers, signum)
    except OSError as e:  # the signal still goes: the ranks checkpoint, and a job with requeue=true is requeued
        print(f"\n{name}: the user-stop marker could not be written ({e}): with launcher.slurm.requeue=true the job "
              f"will be requeued after it stops", file=sys.stderr, flush=True)
    print(f"\n{name}: asking {what} to checkpoint and stop ({command}), then following to the end (Ctrl-C cancels)",
          file=sys.stderr, flush=True)
    refused = stop(job_ids, signum)
    if refused:
        print(f"{name}: Slurm did not pass it on: {refused}", file=sys.stderr, flush=True)


class JobFollower:
    """Follows one job: what it knows of it (the last state shown, the schedule, whether it was cancelled or asked
    to stop) is its own. ``stop_signal``: the plan's, which `run` passes on to the job's batch script;
    ``user_stop``: the marker written before (the script then ends the job rather than requeueing it).
    ``states``, ``clock``, ``sleep``, ``out``, ``cancel`` and ``stop`` are Slurm, the time and the terminal (tests
    pass their own)."""

    def __init__(self, job_id: str, output: Path, states: SlurmStates | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 out: TextIO | None = None, cancel: Callable[[list[str]], None] = scancel,
                 say_where: Callable[[], None] | None = None, stop_signal: int | None = None,
                 user_stop: Path | None = None, stop: Callable[[list[str], int], str | None] = ask_to_stop) -> None:
        self.job_id = job_id
        self.say_where = say_where
        self.stop_signal, self.user_stop = stop_signal, user_stop
        self.states = states or SlurmStates(clock=clock)
        self.schedule = PollSchedule()
        self._clock, self._sleep, self._cancel, self._stop = clock, sleep, cancel, stop
        self._tail = _Tail(output, out or sys.stdout)
        self.stopping: list[int] = []  # the signals that asked `run` to cancel the job
        self.asked: list[int] = []  # the stop signals `run` passed on to the job

    def on_signal(self, signum: int, _frame: object = None) -> None:
        """SIGINT or SIGTERM to `run`: say where the ranks are (Slurm signals every process of the job at once, so
        they cannot say it after), cancel the job (once), and see it end soon."""
        if not self.stopping:
            if self.say_where is not None:
                self.say_where()
            print(f"\n{signal.Signals(signum).name}: cancelling Slurm job {self.job_id} ...", file=sys.stderr)
            self._cancel([self.job_id])
            self.schedule.hurry(self._clock())
        self.stopping.append(signum)

    def on_stop(self, signum: int, _frame: object = None) -> None:
        """The stop signal to `run`: pass it on to the job's batch script (each time: a second one is harmless),
        whose trap asks the ranks to checkpoint and return; the job is followed to its end as before. A job that
        has not started is cancelled instead (nothing to checkpoint). Nothing once the job is being cancelled."""
        if self.stopping:
            return
        markers = [self.user_stop] if self.user_stop is not None else []
        pass_on_stop(signum, [self.job_id], markers, f"Slurm job {self.job_id}", self._stop)
        self.asked.append(signum)
        self.schedule.hurry(self._clock())

    def exit_status(self, outcome: Callable[[], int] | None = None,
                    rank_failed: Callable[[], bool] | None = None) -> int:
        """Follow the job to its end with `run`'s signals handled (:meth:`on_signal`, :meth:`on_stop`); `run`'s exit
        status: the job's; 128 + the signal when `run` cancelled it (or a stop found it not started); 1 when a rank
        failed; ``outcome()`` (the run folder's word) for a job Slurm forgot already."""
        stops = [self.stop_signal] if self.stop_signal is not None and self.stop_signal not in CANCELS else []
        with handling(CANCELS, self.on_signal), handling(stops, self.on_stop):
            last = self.last_state()
        if last is None:  # forgotten already: the run folder tells how its ranks ended
            print(f"slurm job {self.job_id}: ended (no longer known to Slurm)", file=sys.stderr)
        if self.stopping:
            return exits.from_signal(self.stopping[0])
        if last is None:
            return outcome() if outcome else exits.FAILED
        if self.asked and last.state == "CANCELLED":
            name = signal.Signals(self.asked[0]).name
            print(f"slurm job {self.job_id} ended CANCELLED after {name} (a job that had not started is cancelled: "
                  f"nothing to checkpoint)", file=sys.stderr)
            return exits.from_signal(self.asked[0])
        code = exit_status(self.job_id, last)
        return exits.FAILED if code and rank_failed and rank_failed() else code  # a rank failed: 1, as a local run says

    def last_state(self) -> JobStatus | None:
        """Follow the job until it ended (its last state) or Slurm forgot it (None), showing its states and output."""
        shown = None
        while True:
            self._tail.pump()
            now = self._clock()
            if self.schedule.due(now):
                current = self.states.status(self.job_id)
                if current is None:
                    return None
                changed = current.describe() != shown
                if changed:
                    shown = current.describe()
                    print(f"slurm job {self.job_id}: {shown}", file=sys.stderr, flush=True)
                self.schedule.asked(now, changed)
                if current.finished:
                    self._sleep(TAIL_S)  # the output file may still be flushed by the nodes
                    self._tail.pump()
                    return current
            self._sleep(max(0.0, min(TAIL_S, self.schedule.next_at - self._clock())))


def follow(job_id: str, output: Path, outcome: Callable[[], int] | None = None,
           rank_failed: Callable[[], bool] | None = None, say_where: Callable[[], None] | None = None,
           stop_signal: int | None = None, user_stop: Path | None = None) -> int:
    """Wait for a submitted job, showing its state changes and its output; its exit status.

    SIGINT or SIGTERM to `run` says where the ranks are (``say_where``), cancels the job (scancel) and returns
    128 + the signal once it ended. ``stop_signal`` to `run` writes ``user_stop`` and passes the signal on to the
    job's batch script (``scancel --signal=USR1 --batch``): the ranks checkpoint and return, the job ends (it is not
    requeued) and its own exit status is returned, 0 when every rank returned.
    """
    follower = JobFollower(job_id, output, say_where=say_where, stop_signal=stop_signal, user_stop=user_stop)
    return follower.exit_status(outcome, rank_failed)
