"""What validation may ask of the machine it runs on, behind one small interface.

Validation is pure logic over a spec plus these answers; tests pass a :class:`FixedProbe`.
:class:`LocalProbe` asks this machine, lazily, and only what a rule needs (importing torch costs
over a second, so a CPU job with gloo never triggers it).
"""

from __future__ import annotations

import functools
import os
import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from runner.common import extras
from runner.spec.targets import TargetProblem, Trial, module_problem, target_problem, target_trial

TargetTrial = Callable[[str, "str | None"], "TargetProblem | None"]


class MachineProbe(Protocol):
    def cuda_device_count(self) -> int: ...
    def mpi_backend_available(self) -> bool: ...
    def extra_installed(self, name: str) -> bool: ...
    def exists(self, path: str) -> bool: ...
    def is_dir(self, path: str) -> bool: ...
    def host_names(self) -> frozenset[str]: ...
    def program_found(self, name: str) -> bool: ...
    def target_problem(self, target: str, workdir: str | None) -> TargetProblem | None: ...
    def module_problem(self, module: str, workdir: str | None) -> TargetProblem | None: ...


def _nvidia_driver_present() -> bool:
    return os.path.exists("/proc/driver/nvidia") or any(
        name.startswith("nvidia") and name[6:].isdigit() for name in os.listdir("/dev"))


class LocalProbe:
    """Answers about this machine. GPU counting goes through NVML, so it does not poison fork.

    ``try_target``: how a recipe target is tried (runner.spec.targets.target_problem: in a child forked from
    this process; `run`'s launch agent offers one forked from itself, where torch is already imported)."""

    def __init__(self, try_target: TargetTrial = target_problem, try_module: TargetTrial = module_problem) -> None:
        self._try_target = try_target
        self._try_module = try_module

    def target_problem(self, target: str, workdir: str | None) -> TargetProblem | None:
        return self._try_target(target, workdir)

    def module_problem(self, module: str, workdir: str | None) -> TargetProblem | None:
        return self._try_module(module, workdir)

    @functools.cache
    def cuda_device_count(self) -> int:
        if not _nvidia_driver_present():
            return 0  # no driver, no GPU: skip importing torch (over a second) to learn that
        import torch

        return torch.cuda.device_count()

    @functools.cache
    def mpi_backend_available(self) -> bool:
        import torch.distributed as dist

        return dist.is_available() and dist.is_mpi_available()

    @functools.cache
    def extra_installed(self, name: str) -> bool:
        """The extra ``torch-jobspec[name]`` is installed here (runner.common.extras: found, not imported)."""
        return extras.BY_NAME[name].installed()

    def exists(self, path: str) -> bool:
        return os.path.lexists(path)

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(path)

    @functools.cache
    def host_names(self) -> frozenset[str]:
        """This machine's names and the addresses of its interfaces."""
        import psutil

        name = socket.gethostname()
        names = {name, name.split(".")[0], socket.getfqdn()}
        for addrs in psutil.net_if_addrs().values():
            names.update(a.address.split("%")[0] for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6))
        return frozenset(names)

    def program_found(self, name: str) -> bool:
        return shutil.which(name) is not None


class LaunchedProbe(LocalProbe):
    """This machine's answers for a process a launch started with the run's pinned spec (an ssh host's `run`, a
    scheduler's task, the `run` that holds a Slurm job's rounds: runner.app.host_entry), which validates the spec
    again where it runs.

    What is this host's own is asked here, as :class:`LocalProbe` asks it: its devices, folders (workdir, code_dir,
    a script's path), programs and installed extras. Whether the recipe target (or a script's module) imports is
    what the launching `run` found: it tried it where it was started (runner.spec.targets, through its launch agent
    where it has one), and a spec whose target does not import there is refused before it is pinned; so a pinned
    spec (spec.yaml, a round's spec, the spec an ssh host gets on its stdin) is itself the launching side's answer
    that it imports, and it is not tried again here (a forked child importing the user's code, on every host before
    any rank starts). The ranks import it where they run, and a failure there is a rank's error."""

    def target_problem(self, target: str, workdir: str | None) -> TargetProblem | None:
        return None

    def module_problem(self, module: str, workdir: str | None) -> TargetProblem | None:
        return None


@dataclass
class FixedProbe:
    """A machine described by values, for tests and for planning on another machine's behalf."""

    cuda_devices: int = 0
    mpi_backend: bool = False
    missing_extras: frozenset[str] = frozenset()  # the extras (runner.common.extras) not installed
    paths: frozenset[str] = frozenset()
    dirs: frozenset[str] = frozenset({"/shared", "/tmp"})
    names: frozenset[str] = frozenset({"thishost"})
    programs: frozenset[str] = frozenset({"etcd"})  # the programs found on the PATH
    asked: list[str] = field(default_factory=list)

    def cuda_device_count(self) -> int:
        self.asked.append("cuda")
        return self.cuda_devices

    def mpi_backend_available(self) -> bool:
        self.asked.append("mpi")
        return self.mpi_backend

    def extra_installed(self, name: str) -> bool:
        self.asked.append(name)
        return name not in self.missing_extras

    def exists(self, path: str) -> bool:
        return path in self.paths or path in self.dirs

    def is_dir(self, path: str) -> bool:
        return path in self.dirs

    def host_names(self) -> frozenset[str]:
        return self.names

    def program_found(self, name: str) -> bool:
        return name in self.programs

    def target_problem(self, target: str, workdir: str | None) -> TargetProblem | None:
        """This machine's answer: the modules a test names are those of this checkout and its tests."""
        return tried_once(target, workdir)

    def module_problem(self, module: str, workdir: str | None) -> TargetProblem | None:
        return module_problem(module, workdir)


_TRIALS: dict[tuple[str, str | None], Trial] = {}  # a child per distinct target: tests validate thousands of specs


def try_early(target: str, workdir: str | None = None) -> None:
    """Start the trial of ``target`` now, in a forked child, for :func:`tried_once` to answer from later (a test
    session starts the bundled recipe's, whose import of torch then runs beside its collection)."""
    _TRIALS.setdefault(_trial_key(target, workdir), target_trial(target, workdir))


def tried_once(target: str, workdir: str | None) -> TargetProblem | None:
    """:func:`~runner.spec.targets.target_problem`, asked once per target and folder in this process; a target of the
    runner's own package once for every folder without a ``runner`` of its own (from which it is the installed one)."""
    key = _trial_key(target, workdir)
    if key not in _TRIALS:
        try_early(*key)
    return _TRIALS[key].answer()


def _trial_key(target: str, workdir: str | None) -> tuple[str, str | None]:
    shadowed = workdir is not None and any(os.path.exists(os.path.join(workdir, name)) for name in ("runner", "runner.py"))
    return (target, None) if target.startswith("runner.") and not shadowed else (target, workdir)
