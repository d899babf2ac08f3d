"""Launchers: each turns a plan into processes, with a dry run that shows exactly what it would execute."""

from __future__ import annotations

from runner.launchers.base import Invocation, Launcher, LaunchRequest
from runner.launchers.local import LocalLauncher
from runner.launchers.manual import ManualLauncher
from runner.launchers.mpi import MpiLauncher
from runner.launchers.slurm import SlurmLauncher
from runner.spec.schema import LauncherKind

LAUNCHERS: dict[LauncherKind, type[Launcher]] = {
    LauncherKind.local: LocalLauncher,
    LauncherKind.manual: ManualLauncher,
    LauncherKind.mpi: MpiLauncher,
    LauncherKind.slurm: SlurmLauncher,
}

__all__ = ["LAUNCHERS", "Invocation", "Launcher", "LaunchRequest"]
