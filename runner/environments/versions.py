"""Which runner and torch this machine has, as `run --version` says it in one line, and that line read back: the
ssh launcher compares every host's with its own before it starts anything.

Read from the installed distributions' metadata (no ``import torch``: a second, not the half of one `run --version`
takes), so the answer is what a process started here would import.
"""

from __future__ import annotations

import importlib.metadata
import platform
import re
import sys
from dataclasses import dataclass

DISTRIBUTION = "torch-jobspec"  # the runner's distribution (its import package is `runner`, its command `run`)
_LINE = re.compile(r"^run (?P<runner>\S+) \(torch-jobspec\), torch (?P<torch>\S+), Python (?P<python>\S+)")


@dataclass(frozen=True)
class Versions:
    runner: str
    torch: str
    python: str

    def line(self) -> str:
        """What `run --version` prints: ``run 0.1.0 (torch-jobspec), torch 2.13.0+cpu, Python 3.11.7 (/venv/bin/python)``."""
        return f"run {self.runner} ({DISTRIBUTION}), torch {self.torch}, Python {self.python} ({sys.executable})"

    def short(self) -> str:
        return f"runner {self.runner}, torch {self.torch}"

    @classmethod
    def parse(cls, text: str) -> Versions | None:
        """The versions in `run --version`'s output (its first line that is one); None: none is."""
        for line in text.splitlines():
            found = _LINE.match(line.strip())
            if found:
                return cls(found["runner"], found["torch"], found["python"])
        return None


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def installed() -> Versions:
    """This interpreter's runner and torch."""
    return Versions(_version(DISTRIBUTION), _version("torch"), platform.python_version())
