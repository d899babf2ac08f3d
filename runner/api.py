"""The runner's API for training code: what a recipe may use, and all it needs. It is stable: what is named
here keeps its meaning across releases of the runner; everything else in ``runner`` is internal.

A recipe is a function ``main(ctx, cfg)`` in a module of yours (``recipe.target=mypkg.train:main``), called
once in every process of the job with its :class:`RunContext` (its place in the job, the device, wrapping
and sharding, data and its micro-batches, progress, metrics, checkpoints, stop requests) and its config (the spec's ``recipe``
section, an OmegaConf ``DictConfig``). It may return a mapping of final metrics: rank 0's goes into the
run's summary and ``run_summary.json``.

The runner makes the default process group before the call, unless the recipe's config says
``init_process_group: false`` (the recipe makes its own, as ``recipe=script`` does for torchrun-style
scripts), and destroys it after.

To call a recipe in one process — a unit test of yours, a notebook — :func:`single_process_context` gives it the
context ``run topology=1x1`` would. What is named here is frozen: tests/golden/api/runner_api.txt holds its names and
signatures, and a test compares them (and docs/recipes.md's table of the context) with the code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from omegaconf import DictConfig

from runner.spec.batch import BatchSplit
from runner.training.batches import MicroBatch
from runner.training.context import RunContext, single_process_context
from runner.training.progress import Progress


class Recipe(Protocol):
    """The shape of a recipe function."""

    def __call__(self, ctx: RunContext, cfg: DictConfig, /) -> Mapping[str, Any] | None: ...


__all__ = ["BatchSplit", "MicroBatch", "Progress", "Recipe", "RunContext", "single_process_context"]
