"""How each job of a sweep ended, as its run folder records it (``exit_status``): `run`'s Hydra task writes it for a
job it ran, the sweep launcher for a Slurm array's job it followed, and the sweep's summary (runner.reports.sweep)
and `run` (runner.app.sweep_outcome) read it."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path

from runner.common import exits
from runner.records.paths import RunPaths

STOPPED = (exits.from_signal(signal.SIGINT), exits.from_signal(signal.SIGTERM))  # a job's, when `run` was asked to stop


def _job(folder: Path) -> RunPaths:
    """A job's run folder (Hydra's numbered folder in the sweep's)."""
    return RunPaths(folder, folder.name)


def stopped_by_run(folder: Path, code: int | None) -> bool:
    """Whether a job's exit status says a signal to `run` stopped it: Ctrl-C or SIGTERM, or 128 + the stop signal
    where the job's user-stop marker says `run` was sent it (a Slurm job it found not started, and cancelled)."""
    if code in STOPPED:
        return True
    return exits.signal_of(code or 0) is not None and _job(folder).user_stop.exists()


@dataclass(frozen=True, kw_only=True)
class JobExit:
    """How one job of a sweep ended: its run folder and `run`'s exit status for it. The Hydra task returns it (a
    JobReturn's value), and the sweep launcher reads it (a job stopped by a signal to `run` stops the sweep)."""

    folder: Path
    code: int

    @property
    def stopped_by_run(self) -> bool:
        """A signal to `run` stopped the job (:func:`stopped_by_run`)."""
        return stopped_by_run(self.folder, self.code)


def record_exit(folder: Path, code: int) -> JobExit:
    """A job of the sweep ended: its status goes into its folder, where the summary and `run` read it."""
    _job(folder).exit_status.write_text(f"{code}\n")
    return JobExit(folder=folder, code=code)


def recorded_exit(folder: Path) -> JobExit | None:
    """How a job of the sweep ended, as :func:`record_exit` wrote it; None: not recorded (not run, or a Slurm job
    submitted and not followed)."""
    try:
        return JobExit(folder=folder, code=int(_job(folder).exit_status.read_text()))
    except (OSError, ValueError):
        return None
