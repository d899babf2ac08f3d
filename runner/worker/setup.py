"""Everything one process of a job needs, decided before it starts by its host agent (runner.worker.host_agent)
and inherited through fork."""

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
    def code_file(self) -> Path | None:
        """The file of the job's folder (its copy of the code first) this rank's code starts from: the script (a
        folder's ``__main__.py``), the module ``-m`` runs, or the recipe's module; None where it is no such file (an
        installed package's module, a zip file)."""
        spec, recipe = self.spec, self.recipe
        root = Path(spec.code_dir or spec.workdir or os.getcwd())
        if is_script(recipe):
            if recipe.module:
                return _module_file(root, recipe.module, "__main__.py")
            path = Path(spec.workdir or os.getcwd(), str(recipe.path))  # the rank runs it from the job's folder
            path = path / "__main__.py" if path.is_dir() else path
            return path if path.suffix == ".py" and path.is_file() else None
        return _module_file(root, str(recipe.target).split(":", 1)[0], "__init__.py")

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
        return ErrorRecord(place.global_rank, place.local_rank, place.host, socket.gethostname(), os.getpid(),
                           time.time(), _exception_line(exc), shown if shown is not None else
                           "".join(traceback.format_exception(exc)), timeout=is_collective_timeout(exc))


def _module_file(root: Path, module: str, in_package: str) -> Path | None:
    """``module``'s file under ``root`` (``pkg/mod.py``, or ``pkg/mod/<in_package>`` for a package), found without
    importing anything; None: not there."""
    base = root.joinpath(*module.split("."))
    for found in (base.with_suffix(".py"), base / in_package):
        if found.is_file():
            return found
    return None


def _exception_line(exc: BaseException) -> str:
    """``ValueError: message``, or the bare name of an exception without one (``KeyboardInterrupt``), as Python
    ends a traceback."""
    said = str(exc)
    return f"{type(exc).__name__}: {said}" if said else type(exc).__name__
