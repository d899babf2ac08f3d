"""Everything one process of a job needs, decided before it starts: inherited through fork from its host's
launcher (runner.worker.supervise), or built by the task a scheduler started (runner.app.task)."""

from __future__ import annotations

import os
import signal
import socket
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig

from runner.plan.outcome import ErrorRecord, RankOutcome
from runner.plan.paths import RunPaths
from runner.plan.processes import ProcessRecord
from runner.spec.schema import DeviceKind, JobConfig, RecipeConfig

if TYPE_CHECKING:
    from runner.worker.preflight.checks import HostReport


@dataclass(frozen=True)
class RankSetup:
    spec: JobConfig
    recipe: RecipeConfig  # what the runner reads of the recipe config
    recipe_cfg: DictConfig  # what the recipe function receives
    record: ProcessRecord
    world_size: int
    backend: str
    device: DeviceKind
    init_method: str  # concrete: env://, tcp://addr:port, file:///path
    env: dict[str, str]  # this process's variables (runner.environments.child)
    paths: RunPaths
    stop_signal: signal.Signals  # asks it to checkpoint and stop (the plan's, from its launcher)
    echo: bool  # also show this rank's stdout on the launching terminal
    prefix: str = ""  # before each line it shows there (log.console=all or a list of ranks: "[rank 3 node1] ")
    notes: tuple[str, ...] = ()  # what the launch decided for this process (its interface, ...), for its log
    preflight: HostReport | None = None  # preflight=true: its host's checks, on the process that prints its line

    @property
    def outcome(self) -> RankOutcome:
        return RankOutcome(self.paths, self.record.global_rank)

    @property
    def log_file(self) -> Path:
        return self.paths.rank_log(self.record.global_rank)

    def error_record(self, exc: BaseException) -> ErrorRecord:
        """This process's failure record: which rank, where, when, and the traceback, for the report."""
        rec = self.record
        return ErrorRecord(rec.global_rank, rec.local_rank, rec.host, socket.gethostname(), os.getpid(), time.time(),
                           f"{type(exc).__name__}: {exc}", "".join(traceback.format_exception(exc)))
