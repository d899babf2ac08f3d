"""Fakes for following Slurm jobs without Slurm: the clock, Slurm's commands, the terminal."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

from clocks import Clock

__all__ = ["Clock", "Slurm", "Terminal", "ok"]  # the clock too: a test of Slurm's fakes moves the time they answer by


class Slurm:
    """Slurm's commands answered from a table (or by a function of the time); the calls made, with their times."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.calls: list[tuple[float, list[str]]] = []
        self.answers: dict[str, subprocess.CompletedProcess | Callable[[], subprocess.CompletedProcess]] = {}

    def __call__(self, argv: list[str]) -> subprocess.CompletedProcess:
        self.calls.append((self.clock.now, argv))
        answer = self.answers[argv[0]]
        return answer() if callable(answer) else answer

    def times(self, command: str) -> list[float]:
        return [t for t, argv in self.calls if argv[0] == command]


def ok(text: str) -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess([], 0, text, "")


class Terminal:
    """What the follower writes to `run`'s stdout, with the time it wrote it."""

    def __init__(self, clock: Clock) -> None:
        self.clock, self.writes = clock, []

    def write(self, text: str) -> None:
        self.writes.append((self.clock.now, text))

    def flush(self) -> None:
        pass
