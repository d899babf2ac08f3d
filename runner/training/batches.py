"""This process's share of each global batch (:class:`GlobalBatchSampler`), and its micro-batches with their loss
weights (:func:`micro_batches`); the arithmetic is :class:`runner.spec.batch.BatchSplit`'s."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, NamedTuple

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from runner.spec.batch import BatchSplit


class GlobalBatchSampler(DistributedSampler):
    """The indices of rank ``rank``'s share of each global batch, one global batch after another.

    Global batch ``b`` of an epoch is ``perm[b*G:(b+1)*G]``, where ``perm`` is a permutation of the dataset seeded by
    ``seed + epoch`` (the one :class:`~torch.utils.data.DistributedSampler` draws; ``range(len(dataset))`` without
    ``shuffle``): the same samples at every world size. Rank ``r`` takes its positions ``r, r + W, ...`` (its
    :meth:`~runner.spec.batch.BatchSplit.count`), so a DataLoader of batch size ``count(r)`` yields exactly its share
    of each global batch; with an even split this is DistributedSampler's own order. There are ``len(dataset) // G``
    global batches; with ``drop_last=False`` the incomplete one at the end is split the same way (its first samples
    again where it has fewer than ``W``, so that every rank takes one), and every rank's last batch is that share.
    A subclass of DistributedSampler: ``loader.sampler.set_epoch(e)`` and its attributes work as there.
    """

    def __init__(self, dataset: Dataset, split: BatchSplit, rank: int, *, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = True) -> None:
        super().__init__(dataset, num_replicas=split.world_size, rank=rank, shuffle=shuffle, seed=seed,
                         drop_last=drop_last)
        self.split = split
        full, tail = divmod(len(dataset), split.global_size)  # type: ignore[arg-type]
        self.num_samples = full * split.count(rank) + (len(self._tail_positions(tail)) if not drop_last else 0)
        self.total_size = full * split.global_size + (max(tail, split.world_size) if tail and not drop_last else 0)

    def _tail_positions(self, tail: int) -> range:
        """This rank's positions in the incomplete last global batch of ``tail`` samples (padded to one a rank)."""
        if not tail:
            return range(0)
        return range(self.rank, max(tail, self.num_replicas), self.num_replicas)

    def __iter__(self) -> Iterator[int]:
        n = len(self.dataset)  # type: ignore[arg-type]
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            order = torch.randperm(n, generator=generator).tolist()
        else:
            order = list(range(n))
        g, w, r = self.split.global_size, self.num_replicas, self.rank
        full, tail = divmod(n, g)
        for b in range(full):
            yield from order[b * g + r:(b + 1) * g:w]
        if tail and not self.drop_last:
            last = order[full * g:]
            for position in self._tail_positions(tail):
                yield last[position] if position < tail else order[position - tail]

    def __len__(self) -> int:
        return self.num_samples


def global_batch_loader(dataset: Dataset, split: BatchSplit, rank: int, *, shuffle: bool, seed: int, drop_last: bool,
                        **kwargs: Any) -> DataLoader:
    """A DataLoader of rank ``rank``'s share of each global batch (:class:`GlobalBatchSampler`), in batches of its
    count; ``kwargs``: DataLoader's own (num_workers, collate_fn, ...)."""
    sampler = GlobalBatchSampler(dataset, split, rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
    return DataLoader(dataset, batch_size=split.count(rank), sampler=sampler, drop_last=drop_last, **kwargs)


class MicroBatch(NamedTuple):
    """One micro-batch of this process's share of a global batch (:meth:`RunContext.micro_batches`)."""

    data: Any  # the batch's own structure (tensors, tuples, lists, dicts), its samples of this micro-batch
    weight: float  # multiply the micro-batch's mean loss by it before backward: samples * world size / global batch
    share: float  # its part of this process's share (samples / the share's samples): to show the share's mean loss


def batch_length(batch: Any) -> int:
    """The samples in a batch: the first dimension of its first tensor (or the length of a list of plain values,
    such as collated strings)."""
    if isinstance(batch, torch.Tensor):
        if batch.dim() == 0:
            raise ValueError("a micro-batch is cut from a batch's first dimension, but this tensor has none (a 0-d "
                             "tensor): pass the loader's batch as it comes")
        return batch.shape[0]
    if isinstance(batch, Mapping):
        parts: Sequence[Any] = list(batch.values())
    elif isinstance(batch, (tuple, list)):
        if batch and not any(isinstance(v, (torch.Tensor, Mapping, tuple, list)) for v in batch):
            return len(batch)  # collated plain values: one a sample
        parts = batch
    else:
        parts = ()
    for part in parts:
        try:
            return batch_length(part)
        except ValueError:
            continue
    raise ValueError(f"no tensor in the batch to cut micro-batches from (a {type(batch).__name__}): pass the "
                     f"loader's batch as it comes (a tensor, or tuples, lists and dicts of tensors)")


def cut(batch: Any, start: int, stop: int, device: torch.device | None = None) -> Any:
    """Samples ``start:stop`` of a batch, in the batch's own structure (tensors cut on their first dimension, on
    ``device`` where given; collated plain values sliced; anything else kept as it is)."""
    if isinstance(batch, torch.Tensor):
        part = batch[start:stop]
        return part.to(device, non_blocking=True) if device is not None else part
    if isinstance(batch, Mapping):
        return type(batch)({k: cut(v, start, stop, device) for k, v in batch.items()})  # type: ignore[call-arg]
    if isinstance(batch, (tuple, list)):
        if batch and not any(isinstance(v, (torch.Tensor, Mapping, tuple, list)) for v in batch):
            return batch[start:stop]
        parts = [cut(v, start, stop, device) for v in batch]
        if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple
            return type(batch)(*parts)
        return type(batch)(parts)
    return batch


def micro_batches(batch: Any, split: BatchSplit, no_sync: Callable[[], AbstractContextManager[Any]],
                  device: torch.device | None = None) -> Iterator[MicroBatch]:
    """A process's batch as ``split.micro_steps`` micro-batches on ``device``, each with its loss weight. The backward
    passes of all but the last run inside ``no_sync()`` (their gradients accumulate here, unexchanged); the last
    one's exchanges the sum. A micro-batch of no samples (a share smaller than the count of micro-batches) is this
    batch's last sample with weight 0, so that every rank runs the same forwards."""
    n = batch_length(batch)
    sizes = split.micro_sizes(n)
    start = 0
    for i, samples in enumerate(sizes):
        part = cut(batch, start, start + samples, device) if samples else cut(batch, n - 1, n, device)
        start += samples
        with nullcontext() if i == len(sizes) - 1 else no_sync():
            yield MicroBatch(part, split.weight(samples), samples / n)
