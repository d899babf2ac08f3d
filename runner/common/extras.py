"""The optional parts of the distribution (pip extras, ``torch-jobspec[<name>]``): what each brings, what needs it,
and the one line that says it is missing.

The runner's own work (compose, validate, plan, launch, DDP, DP, torch's sharding modes) needs none of them; the
extras serve one feature each, so a launcher does not carry fairscale (in maintenance), scikit-learn or
matplotlib. pyproject.toml's ``[project.optional-dependencies]`` lists the same (tests/common/test_extras.py
compares them). An extra is looked for without importing it (importing fairscale imports torch).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

DISTRIBUTION = "torch-jobspec"


@dataclass(frozen=True)
class Extra:
    """One pip extra of the distribution."""

    name: str  # torch-jobspec[<name>]
    package: str  # what it installs, as PyPI names it
    module: str  # the module that package provides: found or not
    needed_by: str  # what of the runner needs it, in words

    @property
    def install(self) -> str:
        """The command that installs it."""
        return f"pip install '{DISTRIBUTION}[{self.name}]'"

    def installed(self) -> bool:
        """Whether its module can be imported here (found, not imported)."""
        try:
            return importlib.util.find_spec(self.module) is not None
        except (ImportError, ValueError):  # a parent that fails to import, or a module without a spec
            return False

    def missing(self) -> str:
        """Why it is wanted and absent, in one line (the caller adds :attr:`install` as the hint)."""
        return (f"{self.needed_by} needs {self.package}, which is not installed here "
                f"(the extra {DISTRIBUTION}[{self.name}])")


FAIRSCALE = Extra("fairscale", "fairscale", "fairscale",
                  "sharding=oss and sharding=sdp (fairscale's OSS and ShardedDDP)")
EXAMPLES = Extra("examples", "scikit-learn", "sklearn", "the bundled digits recipe (scikit-learn's digits data)")
PLOTS = Extra("plots", "matplotlib", "matplotlib", "a sweep's scaling plot")
EXTRAS: tuple[Extra, ...] = (FAIRSCALE, EXAMPLES, PLOTS)
BY_NAME = {extra.name: extra for extra in EXTRAS}

# the bundled recipes' modules, and the extras each needs (validation refuses one whose extra is missing)
RECIPE_EXTRAS: dict[str, tuple[Extra, ...]] = {"runner.recipes.digits": (EXAMPLES,)}


class MissingExtra(ImportError):
    """An extra that a part of the runner needs is not installed; the message says which and how to install it."""

    def __init__(self, extra: Extra) -> None:
        super().__init__(f"{extra.missing()}; hint: {extra.install}", name=extra.module)
        self.extra = extra


def require(extra: Extra) -> None:
    """Raise :class:`MissingExtra` unless ``extra`` is installed."""
    if not extra.installed():
        raise MissingExtra(extra)
