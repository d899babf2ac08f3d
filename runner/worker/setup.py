"""Everything one process of a job needs, decided before it starts by its host agent (runner.worker.host_agent)
and inherited through fork."""

from __future__ import annotations

import os
import signal
import socket
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig

from runner.common.timeouts import is_collective_timeout
from runner.records.outcomes import ErrorRecord, RankOutcome
from runner.records.paths import RunPaths
from runner.spec.place import RankPlace
from runner.spec.schema import DeviceKind, JobConfig, RecipeConfig, is_script
from runner.worker.relay import Echo

if TYPE_CHECKING:
    from runner.worker.preflight.checks import HostChecks


@dataclass(frozen=True, kw_only=True)
class RankSetup:
    """What the host agent decided for one of its ranks before forking it; the rank inherits it through the fork."""

    spec: JobConfig
    recipe: RecipeConfig  # what the runner reads of the recipe config
    recipe_cfg: DictConfig  # what the recipe function receives
    place: RankPlace  # where it runs: its ranks, host and device (the plan's)
    backend: str
    device: DeviceKind
    init_method: str  # concrete: env://, tcp://addr:port, file:///path
    env: dict[str, str]  # this process's variables (runner.environments.child)
    paths: RunPaths
    stop_signal: signal.Signals  # asks it to checkpoint and stop (the plan's, from its launcher)
    echo: Echo = Echo()  # how it shows on its host agent's terminal (log.console)
    notes: tuple[str, ...] = ()  # what the launch decided for this process (its interface, ...), for its log
    preflight: HostChecks | None = None  # preflight=true: its host's checks, on the process that prints its line

    @property
    def runs_script(self) -> bool:
        """It runs a torchrun-style script as its main program (recipe=script), not a recipe function."""
        return is_script(self.recipe)

    @property
    def outcome(self) -> RankOutcome:
        return RankOutcome(self.paths, self.place.global_rank)

    @property
    def log_file(self) -> Path:
        return self.paths.rank(self.place.global_rank).log

    def error_record(self, exc: BaseException, shown: str | None = None) -> ErrorRecord:
        """This process's failure record: which rank, where, when, and the traceback (``shown``: as the rank
        printed it), for the report; whether torch.distributed timed out, decided here from the exception itself
        (its readers, the agent and the report, take this verdict rather than guess from the text)."""
        place = self.place
        return ErrorRecord(rank=place.global_rank, local_rank=place.local_rank, host=place.host,
                           machine=socket.gethostname(), pid=os.getpid(), timestamp=time.time(),
                           exception=_exception_line(exc),
                           traceback=shown if shown is not None else "".join(traceback.format_exception(exc)),
                           timeout=is_collective_timeout(exc))


def by_rank(setups: Iterable[RankSetup]) -> dict[int, RankSetup]:
    """A host's setups by the global rank of each: how the record of how they ended names them
    (runner.worker.host_ending)."""
    return {setup.place.global_rank: setup for setup in setups}


def _exception_line(exc: BaseException) -> str:
    """``ValueError: message``, or the bare name of an exception without one (``KeyboardInterrupt``), as Python
    ends a traceback; a message that begins with blank lines begins with what it says."""
    said = str(exc).lstrip("\n\r\t ")
    return f"{type(exc).__name__}: {said}" if said else type(exc).__name__
