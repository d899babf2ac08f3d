"""runner.training.batches: each rank's share of every global batch (the same samples at any world size), and the
micro-batches a share is cut into, with their weights. No processes: the ranks' samplers are made side by side."""

from __future__ import annotations

from collections import namedtuple
from contextlib import contextmanager

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from runner.spec.batch import BatchSplit
from runner.training.batches import GlobalBatchSampler, batch_length, cut, micro_batches


def _dataset(n: int) -> TensorDataset:
    return TensorDataset(torch.arange(n))


def _loaders(n: int, g: int, w: int, *, drop_last: bool = True, shuffle: bool = True, epoch: int = 0) -> list[list]:
    """Each rank's batches (sample ids) of one epoch, as ctx.loader gives them."""
    split = BatchSplit(g, w)
    out = []
    for rank in range(w):
        sampler = GlobalBatchSampler(_dataset(n), split, rank, shuffle=shuffle, seed=3, drop_last=drop_last)
        sampler.set_epoch(epoch)
        loader = DataLoader(_dataset(n), batch_size=split.count(rank), sampler=sampler, drop_last=drop_last)
        batches = [b[0].tolist() for b in loader]
        assert len(batches) == len(loader)
        out.append(batches)
    return out


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9).flatmap(lambda w: st.tuples(st.integers(w, 40), st.just(w))), st.integers(0, 200),
       st.integers(0, 3))
def test_global_batch_b_is_the_same_samples_at_every_world_size(gw, extra, epoch) -> None:
    g, w = gw
    n = g + extra
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(3 + epoch)).tolist()
    ranks = _loaders(n, g, w, epoch=epoch)
    assert {len(r) for r in ranks} == {n // g}  # every rank takes the same steps
    for b in range(n // g):
        shares = [ranks[r][b] for r in range(w)]
        assert [len(s) for s in shares] == list(BatchSplit(g, w).counts)
        assert sorted(sum(shares, [])) == sorted(perm[b * g:(b + 1) * g])  # each sample once


@pytest.mark.parametrize("n, g, w", [(1347, 64, 2), (1347, 64, 4), (100, 12, 3), (37, 8, 8)])
@pytest.mark.parametrize("drop_last", [True, False])
def test_an_even_split_is_distributed_sampler_s_own_order(n, g, w, drop_last) -> None:
    """What ctx.loader gave before uneven splits were possible: DistributedSampler's indices, G/W per batch (with
    drop_last=False its last batch pads by repeating where it has fewer samples than ranks; here it does not)."""
    ours = _loaders(n, g, w, drop_last=drop_last)
    for rank in range(w):
        sampler = DistributedSampler(_dataset(n), num_replicas=w, rank=rank, shuffle=True, seed=3, drop_last=drop_last)
        theirs = [b[0].tolist() for b in DataLoader(_dataset(n), batch_size=g // w, sampler=sampler,
                                                    drop_last=drop_last)]
        if drop_last or (n % g) % w == 0:
            assert ours[rank] == theirs
        else:
            assert ours[rank][:-1] == theirs[:-1]


@pytest.mark.parametrize("n, g, w", [(70, 64, 3), (65, 64, 3), (129, 65, 3), (10, 4, 3)])
def test_without_drop_last_the_last_global_batch_is_split_too_and_every_rank_takes_one(n, g, w) -> None:
    ranks = _loaders(n, g, w, drop_last=False)
    assert {len(r) for r in ranks} == {n // g + 1}
    tail = [ranks[r][-1] for r in range(w)]
    assert all(len(t) >= 1 for t in tail)
    assert all(len(tail[r]) <= BatchSplit(g, w).count(r) for r in range(w))
    taken = sum(tail, [])
    if n % g >= w:
        assert len(taken) == len(set(taken)) == n % g  # nothing repeated where every rank has a sample of its own


Pair = namedtuple("Pair", "x y")


@pytest.mark.parametrize("batch", [
    torch.arange(10).reshape(5, 2),
    (torch.arange(5), torch.arange(5) * 2),
    [torch.arange(5), torch.arange(5) * 2],
    {"x": torch.arange(5), "meta": {"ids": torch.arange(5)}},
    Pair(torch.arange(5), torch.arange(5)),
    (["a", "b", "c", "d", "e"], torch.arange(5)),
])
def test_a_batch_is_cut_in_its_own_structure(batch) -> None:
    assert batch_length(batch) == 5
    part = cut(batch, 1, 3)
    assert type(part) is type(batch)
    leaves = list(_leaves(part))
    assert leaves and all(len(leaf) == 2 for leaf in leaves)


def _leaves(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _leaves(v)
    elif obj and all(isinstance(v, str) for v in obj):
        yield obj
    else:
        for v in obj:
            yield from _leaves(v)


def test_a_batch_without_a_first_dimension_is_refused_with_what_to_pass() -> None:
    with pytest.raises(ValueError, match="pass the loader's batch as it comes"):
        batch_length({"n": 3})


def test_micro_batches_skip_the_exchange_but_for_the_last_and_weigh_the_global_mean() -> None:
    """64 over 3, at most 8 at once: 3 micro-batches on every rank (22 -> 8, 7, 7; 21 -> 7, 7, 7)."""
    inside = []

    @contextmanager
    def no_sync():
        inside.append(True)
        yield
        inside[-1] = False

    split = BatchSplit(64, 3, 8)
    x = torch.arange(21.0)
    parts = []
    for micro in micro_batches((x, x), split, no_sync):
        parts.append(micro)
        # the backward of each but the last runs inside no_sync; the last one's outside it
        assert inside == ([False] * (len(parts) - 1) + [True] if len(parts) < 3 else [False, False])
    assert [len(p.data[0]) for p in parts] == [7, 7, 7]
    assert [p.weight for p in parts] == [7 * 3 / 64] * 3 and sum(p.share for p in parts) == pytest.approx(1.0)
    assert torch.equal(torch.cat([p.data[0] for p in parts]), x)


def test_an_empty_micro_batch_repeats_a_sample_with_weight_0() -> None:
    """micro_batch_size=1, 64 over 3: a rank of 21 samples runs 22 forwards, as the rank of 22 does."""
    parts = list(micro_batches(torch.arange(21.0), BatchSplit(64, 3, 1), lambda: _nothing()))
    assert len(parts) == 22
    assert [p.weight for p in parts].count(0.0) == 1 and parts[-1].weight == 0.0 and parts[-1].share == 0.0
    assert parts[-1].data.tolist() == [20.0]


@contextmanager
def _nothing():
    yield
