"""The jobs of one `run -m` in this process, as `run` counts them for its own exit status."""

from __future__ import annotations

from pathlib import Path

from runner.records.job_exits import JobExit, recorded_exit


class SweepOutcome:
    """The jobs of one `run -m` in this process, in the order they ended. `run` makes one and hands it to its Hydra
    task (runner.app.cli), which tells it of each job: one it ran (:meth:`ended`), or one it prepared for a Slurm
    job array (:meth:`deferred`), whose end the sweep launcher records in the job's folder. `run` reads it once the
    sweep is over: 1 when any job failed, 128 + n when a signal to `run` stopped one."""

    def __init__(self) -> None:
        self._ended: list[JobExit] = []
        self._deferred: list[Path] = []

    def ended(self, job: JobExit) -> None:
        self._ended.append(job)

    def deferred(self, folder: Path) -> None:
        self._deferred.append(folder)

    def exits(self) -> list[JobExit]:
        """Every job that ended, those run here first (a job followed in an array has its status in its folder)."""
        return [*self._ended, *(e for f in self._deferred if (e := recorded_exit(f)) is not None)]

    def stopped(self) -> int | None:
        """128 + the signal that stopped a job (Ctrl-C, SIGTERM, a stop signal that found a Slurm job not started):
        the sweep stopped with it; None if none was."""
        return next((e.code for e in self.exits() if e.stopped_by_run), None)
