"""One object owns every path of a run's output folder."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunPaths:
    """The files of one run, all below ``root`` (Hydra's run folder, unique per run)."""

    root: Path
    run_id: str
    attempt: int = 0  # restarts so far (a requeued Slurm job, max_restarts): files of one attempt are its own

    @property
    def spec(self) -> Path:
        """The composed spec, with what the launch pinned (run id, port), as tasks load it."""
        return self.root / "spec.yaml"

    @property
    def plan(self) -> Path:
        return self.root / "plan.json"

    @property
    def launch(self) -> Path:
        """The exact commands (and scripts) the launcher runs."""
        return self.root / "launch.txt"

    @property
    def sbatch_script(self) -> Path:
        return self.root / "job.sbatch"

    @property
    def user_stop(self) -> Path:
        """Written by `run` when it is sent the stop signal while it follows the run's Slurm job, before it passes
        the signal on: the batch script then ends the job after the ranks checkpoint, where after Slurm's
        time-limit signal it requeues it (launcher.slurm.requeue). Removed before each submission."""
        return self.root / "user_stop"

    @property
    def provenance(self) -> Path:
        """What produced the run: git state, packages, torch, hosts, command line (runner.environments.provenance)."""
        return self.root / "provenance.json"

    @property
    def code(self) -> Path:
        """The run's copy of the job's code (launcher.snapshot_code)."""
        return self.root / "code"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank{rank:05d}.log"

    def elastic_error_file(self, rank: int) -> Path:
        """Where torch elastic's ``@record`` writes a rank's failure (TORCHELASTIC_ERROR_FILE)."""
        return self.logs / f"rank{rank:05d}.elastic-error.json"

    # how each rank ended (joined, done, error files): runner.plan.outcome

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def rendezvous_file(self, init_dir: str | None) -> Path:
        """A fresh file per run and attempt, in a folder of the run's own that only the user may enter
        (see :meth:`make_private`): ``<init.dir or run folder>/<run id>.rdzv/attempt<k>``."""
        folder = Path(init_dir) if init_dir else self.root
        return folder / f"{self.run_id}.rdzv" / f"attempt{self.attempt}"

    def channel_folder(self, init_dir: str | None) -> Path:
        """Where an init=file job's processes tell each other what they need to (runner.worker.channel), beside
        its init files: ``<init.dir or run folder>/<run id>.job``, a folder every host sees."""
        folder = Path(init_dir) if init_dir else self.root
        return folder / f"{self.run_id}.job"

    @staticmethod
    def make_private(folder: Path) -> None:
        """Create ``folder`` readable by the user only (0700), unless a host of the run made it already."""
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            return
        os.chmod(folder, 0o700)  # whatever the umask

    def make(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
