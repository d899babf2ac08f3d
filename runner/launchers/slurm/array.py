"""A sweep on Slurm (`run -m topology=1x2,2x2 launcher=slurm`): its jobs go to Slurm as job arrays.

Each job of the sweep is prepared as a single job would be (its own run folder, spec, plan and batch
script, ``job.sbatch``), but not submitted. Jobs whose batch scripts ask for the same resources share
one array (Slurm gives every task of an array the same request); the array's task ids are the jobs'
numbers in the sweep, and task ``i`` runs job ``i``'s own batch script, writing to its run folder.
`run` then follows every array to its end and returns each job's exit status.
"""

from __future__ import annotations

import shlex
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from runner.common import exits
from runner.common.signals import DEFAULT_STOP, handling
from runner.launchers.slurm.follow import CANCELS, PollSchedule, pass_on_stop
from runner.launchers.slurm.job import JobStatus, SlurmError, SlurmStates, ask_to_stop, scancel, submit
from runner.records.outcomes import all_done, any_failed
from runner.records.paths import RunPaths, SweepPaths


@dataclass(frozen=True, kw_only=True)
class ArrayMember:
    """One job of a sweep, prepared (run folder, spec, plan, batch script) but not submitted."""

    paths: RunPaths
    ranks: tuple[int, ...]
    directives: tuple[str, ...]  # its #SBATCH resource lines: jobs that share them share an array
    cwd: str
    parallelism: int | None = None  # launcher.slurm.array_parallelism
    follow: bool = True  # launcher.slurm.follow
    stop_signal: int = DEFAULT_STOP  # the plan's (launcher.slurm.signal): `run` passes it on to the job

    @property
    def folder(self) -> Path:
        return self.paths.root

    def output(self, array_id: str, task: int) -> Path:
        return self.paths.slurm_output(f"{array_id}_{task}")

    def outcome(self) -> int:
        """For a task Slurm forgot already: 0 when every rank left its done file, else 1."""
        return exits.OK if all_done(self.paths, self.ranks) else exits.FAILED

    def rank_failed(self) -> bool:
        return any_failed(self.paths, self.ranks)


@dataclass(frozen=True)
class JobArray:
    """Jobs of a sweep that share one resource request, by their job number in the sweep."""

    members: dict[int, ArrayMember]

    @property
    def directives(self) -> tuple[str, ...]:
        return next(iter(self.members.values())).directives

    @property
    def stop_signal(self) -> int:
        """The members' stop signal: the same for all, as their --signal directive is."""
        return next(iter(self.members.values())).stop_signal

    def script(self, sweep_dir: Path, name: str) -> str:
        q = shlex.quote
        tasks = ",".join(str(n) for n in self.members)
        limits = [m.parallelism for m in self.members.values() if m.parallelism]
        throttle = f"%{min(limits)}" if limits else ""
        # each job's files, as the script names them below its folder (the case below sets $folder)
        job = next(iter(self.members.values())).paths.in_shell_variable("folder")
        lines = [
            "#!/bin/bash",
            f"# Written by `run` for the sweep in {sweep_dir}: jobs {tasks.replace(',', ', ')} of the sweep ask for",
            "# the same resources, so they go as one job array; task i runs job i's own batch script, in its folder.",
            f"#SBATCH --job-name={q(name)}",
            f"#SBATCH --array={tasks}{throttle}",
            # what a task says before it enters its job's folder (nothing, unless that folder is gone)
            f"#SBATCH --output={q(str(SweepPaths(sweep_dir.resolve()).array_output('%A', '%a')))}",
            *self.directives,
            "",
            "set -euo pipefail",
            'case "$SLURM_ARRAY_TASK_ID" in',
        ]
        for n, member in self.members.items():
            lines.append(f"  {n}) folder={q(str(member.folder))} ;;")
        lines += [
            '  *) echo "run: array task $SLURM_ARRAY_TASK_ID is not a job of this sweep" >&2; exit 2 ;;',
            "esac",
            "# the job's script, as this shell (Slurm's --signal reaches its trap), its output in its run folder",
            f'exec bash "{job.sbatch_script}" >>"{job.slurm_output("${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}")}" 2>&1',
        ]
        return "\n".join(lines) + "\n"


def group(members: dict[int, ArrayMember]) -> list[JobArray]:
    """One array per distinct resource request, in the order of the sweep's first job of each."""
    arrays: dict[tuple[str, ...], dict[int, ArrayMember]] = {}
    for n, member in sorted(members.items()):
        arrays.setdefault(member.directives, {})[n] = member
    return [JobArray(m) for m in arrays.values()]


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no output)"


def run_sweep(members: dict[int, ArrayMember], sweep_dir: Path, configs: dict[int, str]) -> dict[int, int | None]:
    """Submit the sweep's arrays and follow them; each job's exit status (None: submitted, not followed).

    SIGINT or SIGTERM to `run` cancels every array (scancel); the jobs not finished yet get 128 + the signal.
    The jobs' stop signal to `run` is passed on to every array's running jobs (:meth:`ArrayFollower.on_stop`).
    """
    arrays = group(members)
    submitted: list[tuple[str, JobArray]] = []
    codes: dict[int, int | None] = {}
    for k, array in enumerate(arrays):
        path = SweepPaths(sweep_dir).array_script(k)
        path.write_text(array.script(sweep_dir, f"run-sweep-{sweep_dir.name}-{k}"))
        cwd = next(iter(array.members.values())).cwd
        for member in array.members.values():
            member.paths.user_stop.unlink(missing_ok=True)  # an earlier launch's stop (the same run ids)
        try:
            array_id = submit(path, cwd)
        except SlurmError as e:
            print(f"error: launcher=slurm: {e}", file=sys.stderr)
            for n in array.members:
                codes[n] = exits.INVALID
            continue
        submitted.append((array_id, array))
        for n, member in array.members.items():
            member.paths.slurm_job_id.write_text(f"{array_id}_{n}\n")
        jobs = ", ".join(str(n) for n in array.members)
        print(f"slurm: submitted job array {array_id} (sweep job(s) {jobs}): {path}", file=sys.stderr)
    follow = [(a, arr) for a, arr in submitted if all(m.follow for m in arr.members.values())]
    for array_id, array in submitted:
        if (array_id, array) not in follow:
            print(f"slurm: not following array {array_id} (launcher.slurm.follow=false): `squeue -j {array_id}` "
                  f"shows it", file=sys.stderr)
            codes.update({n: None for n in array.members})
    if follow:
        follower = ArrayFollower(follow, sweep_dir, configs)
        stops = {array.stop_signal for _, array in follow} - set(CANCELS)
        with handling(CANCELS, follower.on_signal), handling(stops, follower.on_stop):
            codes.update(follower.codes())
    return codes


TICK_S = 1.0  # between state polls, it wakes this often: a cancel (Ctrl-C) is asked about within a second


class ArrayFollower:
    """Follows a sweep's arrays to their end: each task's state changes, and each job's exit status as it ends.
    Slurm is asked on the single job's schedule (runner.launchers.slurm.follow.PollSchedule: every second at
    first and after any task's change, then less and less often, at most every 30 s), all arrays in one call.
    ``states``, ``clock``, ``sleep`` and ``stop`` are Slurm and the time (tests pass their own)."""

    def __init__(self, arrays: list[tuple[str, JobArray]], sweep_dir: Path, configs: dict[int, str],
                 states: SlurmStates | None = None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 stop: Callable[[list[str], int], str | None] = ask_to_stop) -> None:
        self.arrays, self.sweep_dir, self.configs = arrays, sweep_dir, configs
        self.states = states or SlurmStates(clock=clock)
        self.schedule = PollSchedule()
        self._clock, self._sleep, self._stop = clock, sleep, stop
        self.stopping: list[int] = []  # the signals that asked `run` to cancel the arrays
        self.asked: list[int] = []  # the stop signals `run` passed on to them
        self.found: dict[int, int] = {}  # the exit status of each of the sweep's jobs seen to end

    def on_signal(self, signum: int, _frame: object = None) -> None:
        if not self.stopping:
            ids = [a for a, _ in self.arrays]
            print(f"\n{signal.Signals(signum).name}: cancelling Slurm job array(s) {', '.join(ids)} ...", file=sys.stderr)
            scancel(ids)
            self.schedule.hurry(self._clock())
        self.stopping.append(signum)

    def on_stop(self, signum: int, _frame: object = None) -> None:
        """The stop signal to `run`: pass it on to the batch scripts of every array's running jobs (those whose
        stop signal it is), as for a single job (runner.launchers.slurm.follow.JobFollower.on_stop): each job's
        ranks checkpoint and return, and it ends, not requeued; jobs not started yet are cancelled."""
        if self.stopping:
            return
        arrays = [(a, array) for a, array in self.arrays
                  if array.stop_signal == signum and any(n not in self.found for n in array.members)]
        if not arrays:
            return
        ids = [a for a, _ in arrays]
        markers = [m.paths.user_stop for _, array in arrays for n, m in array.members.items() if n not in self.found]
        pass_on_stop(signum, ids, markers, f"Slurm job array(s) {', '.join(ids)}", self._stop)
        self.asked.append(signum)
        self.schedule.hurry(self._clock())

    def codes(self) -> dict[int, int]:
        """Each job's exit status, once every one has ended."""
        shown: dict[int, str] = {}
        last: dict[int, JobStatus] = {}
        codes = self.found
        while True:
            now = self._clock()
            if not self.schedule.due(now):
                self._sleep(max(0.0, min(TICK_S, self.schedule.next_at - now)))
                continue
            changed = False
            tasks = _tasks(self.states, [a for a, array in self.arrays if any(n not in codes for n in array.members)])
            for array_id, array in self.arrays:
                pending = [n for n in array.members if n not in codes]
                if not pending:
                    continue
                known = tasks.get(array_id, {})
                for n in pending:
                    member, name = array.members[n], f"{array_id}_{n}"
                    current = known.get(n)
                    if current is None and (n in last or not known):
                        # ended and forgotten since (or the whole array was): the run folder says how
                        codes[n] = self._code(member, None)
                        _ended(self.sweep_dir, array_id, n, self.configs, member, codes[n], self._signal_of(codes[n]))
                        changed = True
                        continue
                    if current is None:
                        continue  # not listed yet
                    last[n] = current
                    if current.describe() != shown.get(n):
                        shown[n] = current.describe()
                        changed = True
                        print(f"slurm job {name} (sweep job {n}: {self.configs.get(n, '')}): {shown[n]}",
                              file=sys.stderr, flush=True)
                    if current.finished:
                        codes[n] = self._code(member, current)
                        _ended(self.sweep_dir, array_id, n, self.configs, member, codes[n], self._signal_of(codes[n]))
            if all(n in codes for _, array in self.arrays for n in array.members):
                return codes
            self.schedule.asked(now, changed)

    def _signal_of(self, code: int) -> int | None:
        """The signal to `run` that a job's exit status says stopped it (128 + a signal it was sent), or None."""
        return next((s for s in self.stopping + self.asked if code == exits.from_signal(s)), None)

    def _code(self, member: ArrayMember, job: JobStatus | None) -> int:
        """A job's exit status from its last state (None: Slurm forgot it, the run folder says) and `run`'s signals:
        128 + the signal when `run` cancelled it, or when the stop signal found it not started (cancelled, no rank
        ran); 1 when a rank failed."""
        if self.stopping:
            return exits.from_signal(self.stopping[0])
        if job is None:
            code = member.outcome()
            if code and self.asked and not member.rank_failed():  # cancelled before it started
                return exits.from_signal(self.asked[0])
            return code
        if job.state == "COMPLETED":
            return exits.OK
        if job.state == "CANCELLED" and self.asked:
            return exits.from_signal(self.asked[0])
        code = job.exit_code or exits.FAILED
        return exits.FAILED if member.rank_failed() else code  # a rank failed: 1, as a local run says


def _tasks(states: SlurmStates, array_ids: list[str]) -> dict[str, dict[int, JobStatus]]:
    """The status of each task Slurm knows of these arrays (one sacct call for all), by array and task id."""
    found: dict[str, dict[int, JobStatus]] = {}
    if not array_ids:
        return found
    for status in states.of(array_ids):
        found.setdefault(status.job, {}).update({n: status for n in status.tasks})
    return found


def _ended(sweep_dir: Path, array_id: str, n: int, configs: dict[int, str], member: ArrayMember, code: int,
           stopped_by: int | None = None) -> None:
    name = f"{array_id}_{n}"
    early = SweepPaths(sweep_dir).array_output(array_id, n)  # the array's own output file for this task
    if early.exists() and early.stat().st_size == 0:
        early.unlink()
    if code == 0:
        print(f"sweep job {n} ({configs.get(n, '')}): done, in {member.folder}", file=sys.stderr, flush=True)
        return
    if stopped_by is not None:
        print(f"sweep job {n} ({configs.get(n, '')}): stopped by {signal.Signals(stopped_by).name} (exit {code}), "
              f"slurm job {name}", file=sys.stderr, flush=True)
        return
    output = member.output(array_id, n)
    print(f"sweep job {n} ({configs.get(n, '')}): failed (exit {code}), slurm job {name}; the end of "
          f"{output}:", file=sys.stderr)
    print("  " + _tail(output).replace("\n", "\n  "), file=sys.stderr, flush=True)

