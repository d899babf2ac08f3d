"""Launchers: each turns a plan into processes, with a dry run that shows exactly what it would execute, and
owns the rules of its kind of launch (runner.launchers.base). Adding one: a module with a Launcher subclass,
a line in LAUNCHERS, and a conf/launcher/<name>.yaml that sets ``kind: <name>``."""

from __future__ import annotations

from runner.launchers.base import Invocation, Launcher, LaunchOutcome, LaunchRequest
from runner.launchers.local import LocalLauncher
from runner.launchers.manual import ManualLauncher
from runner.launchers.mpi import MpiLauncher
from runner.launchers.slurm.launcher import SlurmLauncher
from runner.launchers.ssh.launcher import SshLauncher
from runner.plan.processes import Plan
from runner.records.paths import RunPaths
from runner.spec.job import Job
from runner.spec.probe import MachineProbe
from runner.spec.problems import Problem
from runner.spec.schema import JobConfig
from runner.spec.validation import validate as validate_with

LAUNCHERS: dict[str, type[Launcher]] = {cls.name: cls for cls in (LocalLauncher, ManualLauncher, MpiLauncher, SlurmLauncher,
                                                                   SshLauncher)}


def launcher_of(spec: JobConfig) -> type[Launcher] | None:
    return LAUNCHERS.get(spec.launcher.kind)


def validate(spec: JobConfig, probe: MachineProbe) -> tuple[Job | None, list[Problem]]:
    """Validate ``spec`` with the rules of the launcher it names (runner.spec.validation.validate)."""
    launcher = launcher_of(spec)
    if launcher is None:
        return None, [Problem("launcher.kind", f"{spec.launcher.kind!r} is not a launcher",
                              f"one of {', '.join(LAUNCHERS)} (launcher=<name>)")]
    return validate_with(spec, probe, launcher)


def plan_for(job: Job, paths: RunPaths | None = None) -> Plan:
    """The job's plan under the rules of the launcher its spec names (Launcher.plan_for)."""
    return LAUNCHERS[job.spec.launcher.kind].plan_for(job, paths)

__all__ = ["LAUNCHERS", "Invocation", "LaunchOutcome", "LaunchRequest", "Launcher", "launcher_of", "plan_for", "validate"]
