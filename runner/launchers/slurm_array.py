"""A sweep on Slurm (`run -m ... launcher=slurm`): its jobs go to Slurm as job arrays, one array per
resource shape, and `run` follows them all to their end."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ArrayMember:
    """One job of a sweep, prepared (run folder, spec, plan, batch script) but not submitted."""

    folder: Path
    script: Path  # the job's own batch script: what its array task runs
    directives: tuple[str, ...]  # its #SBATCH resource lines: jobs that share them share an array
    cwd: str
    done_files: tuple[Path, ...]  # one per rank: every rank's recipe returned
    error_files: tuple[Path, ...]  # a rank raised
