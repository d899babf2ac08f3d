"""How one global batch is split over the processes of a job, and over micro-batches within a process.

The global batch ``G`` (``recipe.global_batch_size``) is kept whatever the world size ``W``: every step takes the
same ``G`` samples. Rank ``r`` takes the samples at positions ``r, r + W, r + 2W, ...`` of the global batch, so it
takes ``n_r = G // W`` samples, one more for the first ``G % W`` ranks (64 over 3 processes: 22, 21, 21), and
every sample of the global batch is taken once.

A step's gradient is the mean over the global batch, ``(1/G) * sum of the G samples' gradients``, at every world
size. DDP (and every sharding mode: they reduce the same gradients) averages the ranks' gradients, dividing by
``W``; so the mean loss of a part of ``m`` samples is weighted by ``m * W / G`` (:meth:`BatchSplit.weight`). With
an even split a rank's whole share weighs ``(G/W) * W / G = 1``: nothing changes.

``recipe.micro_batch_size`` ``M`` caps the samples a process puts through its model at once: each process then
splits its share into ``k = ceil(ceil(G / W) / M)`` micro-batches (the same ``k`` on every rank: a sharded model's
forward is collective), as even as they go, and accumulates their gradients before the one step. Where a rank
has fewer samples than ``k`` (``M = 1`` with an uneven split), its last micro-batch repeats a sample with weight 0,
so that every rank runs the same forwards.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from runner.spec.problems import Problem

SHOWN_COUNTS = 8  # processes listed one by one in a split's description; more are shown as runs of equal counts


def even_parts(total: int, parts: int) -> tuple[int, ...]:
    """``total`` in ``parts`` whole parts as even as they go, the larger first: ``even_parts(22, 3) == (8, 7, 7)``."""
    base, extra = divmod(total, parts)
    return tuple(base + (i < extra) for i in range(parts))


@dataclass(frozen=True)
class BatchSplit:
    """A global batch of ``global_size`` samples over ``world_size`` processes, at most ``micro_size`` at once in
    each (None: a process's whole share at once). Valid when ``global_size >= world_size`` (every rank takes a
    sample; :func:`batch_problems` says so otherwise)."""

    global_size: int
    world_size: int
    micro_size: int | None = None

    def count(self, rank: int) -> int:
        """Samples rank ``rank`` takes of each global batch: ``G // W``, one more for the first ``G % W`` ranks."""
        return self.global_size // self.world_size + (rank < self.global_size % self.world_size)

    @property
    def counts(self) -> tuple[int, ...]:
        return even_parts(self.global_size, self.world_size)

    @property
    def even(self) -> bool:
        return self.global_size % self.world_size == 0

    @property
    def micro_steps(self) -> int:
        """Micro-batches every process runs per step: ``ceil(ceil(G / W) / M)``; 1 without a micro-batch size."""
        if self.micro_size is None:
            return 1
        return math.ceil(self.count(0) / self.micro_size)

    def micro_sizes(self, samples: int) -> tuple[int, ...]:
        """The sizes of the :attr:`micro_steps` micro-batches of a share of ``samples`` (this rank's count, or what
        the last, incomplete global batch of an epoch gave it), as even as they go; 0 where the share is smaller than
        the count of micro-batches (its place is taken by a sample of weight 0)."""
        return even_parts(samples, self.micro_steps)

    def weight(self, samples: int) -> float:
        """The weight of the mean loss of ``samples`` samples of this rank, so that the ranks' gradients, averaged
        over the world size as DDP does, are the mean over the global batch: ``samples * W / G``."""
        return samples * self.world_size / self.global_size

    def describe(self) -> str:
        """The dry run's words: "64 over 3 processes: 22, 21, 21" (and the micro-batches, where they are set)."""
        g, w = self.global_size, self.world_size
        if w == 1:
            text = f"{g} in 1 process"
        elif self.even:
            text = f"{g} over {w} processes: {g // w} each"
        elif w <= SHOWN_COUNTS:
            text = f"{g} over {w} processes: {', '.join(map(str, self.counts))}"
        else:
            more = g % w
            text = (f"{g} over {w} processes: {g // w + 1} (ranks 0-{more - 1}), "
                    f"{g // w} (ranks {more}-{w - 1})")
        if self.micro_size is not None:
            k = self.micro_steps
            text += (f"; at most {self.micro_size} through the model at once: "
                     + (f"{k} micro-batches a step" if k > 1 else "no accumulation"))
        return text


def batch_problems(global_size: object, micro_size: object, world_size: int) -> Iterator[Problem]:
    """``recipe.global_batch_size`` and ``recipe.micro_batch_size`` against the job's largest world size (the
    world only shrinks from there when hosts are lost, so every smaller one fits too)."""
    if global_size is None:
        if micro_size is not None:
            yield Problem("recipe.micro_batch_size", f"{micro_size} without a global batch: the micro-batches split "
                                                     f"each process's share of recipe.global_batch_size",
                          "set recipe.global_batch_size, or leave recipe.micro_batch_size unset")
        return
    if not isinstance(global_size, int) or isinstance(global_size, bool):
        yield Problem("recipe.global_batch_size", f"must be a whole number, got {global_size!r}",
                      "e.g. recipe.global_batch_size=64")
        return
    if global_size < 1:
        yield Problem("recipe.global_batch_size", f"must be at least 1, got {global_size}",
                      "e.g. recipe.global_batch_size=64")
        return
    if global_size < world_size:
        idle = f"rank {global_size}" if world_size - global_size == 1 else f"ranks {global_size}-{world_size - 1}"
        yield Problem("recipe.global_batch_size",
                      f"{global_size} over world size {world_size} leaves {idle} without a sample "
                      f"({global_size} < {world_size}: each process takes at least one of each global batch)",
                      f"recipe.global_batch_size={world_size} or more, or fewer processes")
    if micro_size is None:
        return
    if not isinstance(micro_size, int) or isinstance(micro_size, bool) or micro_size < 1:
        yield Problem("recipe.micro_batch_size", f"must be a whole number of at least 1, got {micro_size!r}",
                      "e.g. recipe.micro_batch_size=16, or null: each process's whole share at once")
    elif micro_size > global_size:
        yield Problem("recipe.micro_batch_size",
                      f"{micro_size} is larger than the global batch {global_size}: no process ever takes more than "
                      f"{global_size} samples a step (the whole global batch, at world size 1)",
                      f"recipe.micro_batch_size={global_size} or less (the most samples your model takes at once on "
                      f"one device), or null")
