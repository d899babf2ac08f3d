"""Slurm jobs that `run` submits: sbatch, what Slurm says of them, scancel, and the exit status of one that ended
(runner.launchers.slurm.follow follows a job to its end; runner.launchers.slurm.array a sweep's arrays).

Job states come from ``sacct`` (every job and array task asked about, in one call), which remembers jobs
after their end; where accounting is not kept (``sacct`` refuses: "accounting storage is disabled") or has
not listed a job yet, from ``scontrol show job``, which forgets a job MinJobAge after its end.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from runner.common import exits

# states after which a job does nothing more (REQUEUED and COMPLETING are on the way elsewhere)
TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
                      "DEADLINE", "OUT_OF_MEMORY", "SPECIAL_EXIT", "REVOKED"})
_FAILURE_HINTS = {
    "TIMEOUT": "it reached its time limit (launcher.slurm.time); launcher.slurm.requeue=true checkpoints and requeues",
    "CANCELLED": "it was cancelled (scancel, or an administrator)",
    "NODE_FAIL": "a node of the job failed; `scontrol show node` says which",
    "OUT_OF_MEMORY": "a task ran out of memory; ask for more with launcher.slurm.mem",
    "PREEMPTED": "it was preempted; launcher.slurm.requeue=true requeues it",
}


class SlurmError(Exception):
    pass


def task_ids(text: str) -> tuple[int, ...]:
    """Slurm's array task ids: ``3``, or for tasks still pending together ``0,2-4%2`` (``[0,2-4%2]`` in sacct)."""
    ids: list[int] = []
    for part in text.strip("[]").split("%")[0].split(","):
        first, _, last = part.partition("-")
        if first.isdigit():
            ids += range(int(first), int(last or first) + 1)
    return tuple(ids)


@dataclass(frozen=True, kw_only=True)
class JobStatus:
    """What Slurm says of a job, or of one or more tasks of a job array (``tasks``)."""

    job: str  # the job id; an array's id for its tasks
    state: str
    reason: str = ""
    exit_code: int = 0
    exit_signal: int = 0
    nodes: str = ""
    restarts: int = 0
    tasks: tuple[int, ...] = ()  # array task ids this record is about; () for a plain job

    @classmethod
    def parse(cls, text: str) -> JobStatus:
        """One record of ``scontrol show job -o``."""
        def field(key: str, default: str = "") -> str:
            m = re.search(rf"(?:^|\s){key}=(\S*)", text)
            return m.group(1) if m else default

        code, _, sig = field("ExitCode", "0:0").partition(":")
        array = field("ArrayJobId")
        return cls(job=array or field("JobId"), state=field("JobState", "UNKNOWN"), reason=field("Reason"),
                   exit_code=int(code or 0), exit_signal=int(sig or 0), nodes=field("NodeList"),
                   restarts=int(field("Restarts", "0") or 0), tasks=task_ids(field("ArrayTaskId")) if array else ())

    @classmethod
    def parse_sacct(cls, line: str) -> JobStatus | None:
        """One line of ``sacct -X -n -P -o JobID,State,ExitCode,NodeList,Reason``."""
        parts = line.split("|")
        if len(parts) < 5:
            return None
        job_id, state, exit_code, nodes, reason = parts[:5]
        code, _, sig = exit_code.partition(":")
        job, _, tasks = job_id.partition("_")
        return cls(job=job, state=(state.split() or ["UNKNOWN"])[0], reason=reason,
                   exit_code=int(code or 0) if code.isdigit() else 0, exit_signal=int(sig or 0) if sig.isdigit() else 0,
                   nodes=nodes, tasks=task_ids(tasks) if tasks else ())

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL

    def describe(self) -> str:
        where = f" on {self.nodes}" if self.state == "RUNNING" and self.nodes not in ("", "(null)") else ""
        why = f" ({self.reason})" if self.reason not in ("", "None") and self.state != "RUNNING" else ""
        again = f", restart {self.restarts}" if self.restarts else ""
        return f"{self.state}{where}{why}{again}"


def _slurm(argv: list[str], cwd: str | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, cwd=cwd)
    except FileNotFoundError:
        raise SlurmError(f"`{argv[0]}` is not on PATH: this machine is not a Slurm login node; hint: run on one, "
                         f"or use dry_run=true to see the batch script") from None


def submit(script: Path, cwd: str | None) -> str:
    """Submit a batch script from ``cwd`` (the job's working folder); its job id."""
    out = _slurm(["sbatch", "--parsable", str(script)], cwd)
    if out.returncode != 0:
        raise SlurmError(f"sbatch refused the job: {out.stderr.strip()}")
    return out.stdout.strip().split(";")[0]


SACCT_RETRY_S = 30.0  # sacct failed: it is asked again this much later, twice as late after each failure ...
SACCT_RETRY_LONGEST_S = 600.0  # ... up to this
Runner = Callable[[list[str]], subprocess.CompletedProcess]


class SlurmStates:
    """What Slurm says of jobs, asked again and again while `run` follows them: ``sacct`` for every job in one
    call, ``scontrol`` for a job it does not list (not recorded yet) and while sacct does not answer.

    A failed sacct is asked again :data:`SACCT_RETRY_S` later, and twice as late after each failure in a row (up to
    :data:`SACCT_RETRY_LONGEST_S`): where accounting is not kept it costs a call every ten minutes, and where
    slurmdbd was only down for a while its answers come back, and with them jobs that scontrol has forgotten.
    ``run`` and ``clock`` are Slurm's commands and the time (tests pass their own)."""

    def __init__(self, run: Runner = _slurm, clock: Callable[[], float] = time.monotonic) -> None:
        self._run, self._clock = run, clock
        self._sacct_after = float("-inf")  # sacct is not asked before this time
        self._sacct_wait = SACCT_RETRY_S

    def of(self, job_ids: Iterable[str]) -> list[JobStatus]:
        """These jobs (and their array tasks); none for a job Slurm has forgotten."""
        ids = list(dict.fromkeys(job_ids))
        found = self._from_sacct(ids) or []
        listed = {s.job for s in found}
        for job_id in ids:
            if job_id not in listed:
                found += self._from_scontrol(job_id)
        return found

    def status(self, job_id: str) -> JobStatus | None:
        """The job's status; None once Slurm has forgotten it."""
        records = [s for s in self.of([job_id]) if s.job == job_id]
        return records[0] if records else None

    def _from_sacct(self, job_ids: list[str]) -> list[JobStatus] | None:
        """The jobs' states from one ``sacct`` call; None where it does not answer (or is not asked yet again)."""
        now = self._clock()
        if now < self._sacct_after:
            return None
        out = self._run(["sacct", "-X", "-n", "-P", "-o", "JobID,State,ExitCode,NodeList,Reason", "-j",
                         ",".join(job_ids)])
        if out.returncode != 0:
            self._sacct_after = now + self._sacct_wait
            self._sacct_wait = min(2 * self._sacct_wait, SACCT_RETRY_LONGEST_S)
            return None
        self._sacct_wait = SACCT_RETRY_S
        return [s for line in out.stdout.splitlines() if line.strip() and (s := JobStatus.parse_sacct(line))]

    def _from_scontrol(self, job_id: str) -> list[JobStatus]:
        """``scontrol show job -o``: a record per job or array task; none once Slurm has forgotten the job."""
        out = self._run(["scontrol", "show", "job", "-o", job_id])
        if out.returncode != 0:
            if "Invalid job id" in out.stderr:
                return []
            raise SlurmError(f"scontrol show job {job_id}: {out.stderr.strip()}")
        return [JobStatus.parse(line) for line in out.stdout.splitlines() if line.strip()]


def scancel(job_ids: list[str]) -> None:
    _slurm(["scancel", *job_ids])


def stop_command(job_ids: list[str], signum: int) -> list[str]:
    """``scancel --signal=USR1 --batch JOB...``: the signal to the batch script of each job (each running task of an
    array), not to its steps; the script's trap passes it on to the srun step, which passes it to the ranks."""
    return ["scancel", f"--signal={signal.Signals(signum).name.removeprefix('SIG')}", "--batch", *job_ids]


def ask_to_stop(job_ids: list[str], signum: int, run: Runner = _slurm) -> str | None:
    """Ask jobs to checkpoint and stop with the stop signal (:func:`stop_command`); None, or what Slurm said when it
    refused. A job (an array's task) still pending has nothing to checkpoint and Slurm signals no pending job: it is
    cancelled first, so that it does not start after the stop (``--state=PENDING``: one that started meanwhile is
    not cancelled, it gets the signal)."""
    run(["scancel", "--state=PENDING", *job_ids])
    out = run(stop_command(job_ids, signum))
    if out.returncode == 0:
        return None
    return out.stderr.strip() or f"exit status {out.returncode}"


def mark_user_stop(paths: Iterable[Path], signum: int) -> None:
    """Write each job's user-stop marker (:attr:`runner.records.paths.RunPaths.user_stop`) before its batch script
    gets the stop signal: the script then ends the job rather than requeueing it, as it does after Slurm's
    time-limit signal."""
    said = (f"{signal.Signals(signum).name} to `run` (pid {os.getpid()}) at {time.strftime('%Y-%m-%d %H:%M:%S')}: "
            f"the job ends after its ranks checkpoint, it is not requeued\n")
    for path in paths:
        path.write_text(said)


def exit_status(job_id: str, job: JobStatus) -> int:
    if job.state == "COMPLETED":
        return exits.OK
    hint = _FAILURE_HINTS.get(job.state, "the batch output above and logs/ say why")
    print(f"slurm job {job_id} ended {job.state} (exit code {job.exit_code}"
          f"{f', signal {job.exit_signal}' if job.exit_signal else ''}): {hint}", file=sys.stderr)
    return job.exit_code or exits.FAILED
