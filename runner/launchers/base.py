"""What every launcher is: a plan in, a request out (the exact commands), then the launch."""

from __future__ import annotations

import shlex
import signal
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import ClassVar

from runner.app.agent import HostRun
from runner.plan.paths import RunPaths
from runner.plan.processes import Deferred, Plan


@dataclass(frozen=True)
class Invocation:
    """How `run` was called, so that commands for other hosts or tasks can repeat it."""

    python: str  # interpreter for tasks the launcher starts
    cwd: str
    overrides: tuple[str, ...] = ()  # the command line's Hydra overrides
    config_dir: str | None = None  # --config-dir, if one was given
    config_name: str | None = None  # --config-name, if not the built-in `job`
    run_command: str = "run"  # the `run` executable, as other hosts should call it


@dataclass(frozen=True)
class HostCommand:
    """What runs on one host (or on the submitting host): a command line, or a note for in-process work."""

    host: str
    argv: tuple[str, ...] | None
    note: str = ""
    cwd: str | None = None

    def render(self) -> str:
        lines = [f"# {self.host}: {self.note}" if self.note else f"# {self.host}"]
        if self.argv is not None:
            cmd = shlex.join(self.argv)
            lines.append(f"cd {shlex.quote(self.cwd)} && {cmd}" if self.cwd else cmd)
        return "\n".join(lines)


@dataclass(frozen=True)
class LaunchRequest:
    """Everything a launch executes, materialized; the dry run prints it, the launch runs it."""

    launcher: str
    commands: tuple[HostCommand, ...]
    files: dict[str, str] = field(default_factory=dict)  # run-folder file name -> content (batch scripts)
    pins: dict[str, object] = field(default_factory=dict)  # spec keys fixed for this run (run_id, port)

    def materialize(self) -> str:
        parts = [c.render() for c in self.commands]
        for name, text in self.files.items():
            parts.append(f"# --- {name} ---\n{text.rstrip()}")
        return "\n\n".join(parts) + "\n"


class Launcher(ABC):
    """Turns a plan into processes. Subclasses build the request; the base class owns the flow."""

    name: ClassVar[str]

    def __init__(self, plan: Plan, paths: RunPaths, invocation: Invocation, run_host: HostRun | None = None) -> None:
        self.plan = plan
        self.paths = paths
        self.invocation = invocation
        self._run_host = run_host

    def run_host(self, node_rank: int, recipe_cfg) -> int:
        """Start host ``node_rank``'s processes here and wait for them: through the launch agent when
        `run` has one (runner.app.agent), else in this process."""
        if self._run_host is not None:
            return self._run_host(self.plan, node_rank, self.paths, recipe_cfg)
        from runner.worker.supervise import launch_host

        return launch_host(self.plan, node_rank, self.paths, recipe_cfg)

    @abstractmethod
    def request(self) -> LaunchRequest:
        """The exact commands this launch would execute (no side effects)."""

    def rank_failed(self) -> bool:
        """A rank of this run raised: it left its error file (runner.worker.rank.write_error)."""
        return any(self.paths.error_file(r.global_rank).exists() for r in self.plan.records)

    def launch(self, request: LaunchRequest, recipe_cfg) -> int:
        """Run the job; the exit status of `run`."""
        import sys

        print(f"error: launcher={self.name}: `run` does not start these jobs itself yet; nothing was started.\n"
              f"    hint: run the commands below (also in {self.paths.launch}); launcher=local and launcher=manual "
              f"launch from `run`\n\n{request.materialize().rstrip()}", file=sys.stderr)
        return 2

    def task_argv(self) -> tuple[str, ...]:
        """How a task started by a scheduler (srun, mpirun) enters the runner: it loads the pinned spec.
        ``-P``: not the folder the task starts in (the user's) but the installed runner (runner.app.task)."""
        return (self.invocation.python, "-P", "-m", "runner.app.task", str(self.paths.spec))

    def pins(self, port: bool = False) -> dict[str, object]:
        """Spec keys this launch fixes for every process: the run id, and the master port where the
        plan agreed on one (see runner.plan.processes._master_port)."""
        pins: dict[str, object] = {"run_id": self.paths.run_id}
        if port and not isinstance(self.plan.master_port, Deferred):
            pins["init.master_port"] = int(self.plan.master_port)
        return pins


def run_forwarding_signals(argv: list[str], cwd: str | None, forward: tuple[int, ...],
                           rank_failed: Callable[[], bool] = lambda: False) -> int:
    """Run a scheduler's command (srun, mpirun) to its end, passing `run`'s signals on to it (it passes
    them to the tasks). The exit status for `run`: 128 + n when `run` got signal n (SIGINT, SIGTERM)
    and the command failed; 1 when a rank raised (``rank_failed``: the scheduler may report the status of
    the tasks it stopped because of it instead, e.g. srun's 143); else the command's."""
    import subprocess

    proc = subprocess.Popen(argv, cwd=cwd)

    received: list[int] = []

    def pass_on(signum: int, _frame: object) -> None:
        received.append(signum)
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass

    previous = {s: signal.signal(s, pass_on) for s in forward}
    try:
        code = proc.wait()  # retried after each forwarded signal (PEP 475)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    code = code if code >= 0 else 128 - code
    stopped = [s for s in received if s in (signal.SIGINT, signal.SIGTERM)]
    if code and stopped:
        return 128 + stopped[0]
    return 1 if code and rank_failed() else code
