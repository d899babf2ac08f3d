"""runner.spec.batch: a global batch split exactly over any world size, and over micro-batches within a process."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runner.spec.batch import BatchSplit, batch_problems, even_parts

pytestmark = pytest.mark.unit

splits = st.integers(1, 64).flatmap(lambda w: st.tuples(st.integers(w, 4096), st.just(w),
                                                        st.one_of(st.none(), st.integers(1, 512))))


def test_the_issue_s_example_and_the_dry_run_s_words() -> None:
    split = BatchSplit(64, 3)
    assert split.counts == (22, 21, 21) and [split.count(r) for r in range(3)] == [22, 21, 21]
    assert split.describe() == "64 over 3 processes: 22, 21, 21"
    assert BatchSplit(64, 2).describe() == "64 over 2 processes: 32 each"
    assert BatchSplit(64, 1).describe() == "64 in 1 process"
    assert BatchSplit(1000, 128).describe() == "1000 over 128 processes: 8 (ranks 0-103), 7 (ranks 104-127)"
    assert BatchSplit(64, 3, 16).describe() == ("64 over 3 processes: 22, 21, 21; at most 16 through the model at "
                                                "once: 2 micro-batches a step")
    assert BatchSplit(64, 4, 16).describe().endswith("; at most 16 through the model at once: no accumulation")


@settings(max_examples=50, deadline=None)
@given(splits)
def test_every_sample_is_taken_once_and_the_shares_differ_by_at_most_one(case) -> None:
    g, w, m = case
    split = BatchSplit(g, w, m)
    counts = split.counts
    assert sum(counts) == g and len(counts) == w
    assert set(counts) <= {g // w, math.ceil(g / w)} and list(counts) == sorted(counts, reverse=True)
    assert sum(1 for c in counts if c > g // w) == g % w  # the first G % W ranks take one more
    # positions r, r + W, ... of the global batch: as many as the rank's count
    assert [len(range(r, g, w)) for r in range(w)] == list(counts)


@settings(max_examples=50, deadline=None)
@given(splits)
def test_micro_batches_cover_each_share_within_the_cap_and_weigh_the_global_mean(case) -> None:
    g, w, m = case
    split = BatchSplit(g, w, m)
    k = split.micro_steps
    assert k == (1 if m is None else math.ceil(math.ceil(g / w) / m))
    total_weight = 0.0
    for rank in range(w):
        sizes = split.micro_sizes(split.count(rank))
        assert len(sizes) == k and sum(sizes) == split.count(rank)  # the same forwards on every rank
        assert max(sizes) <= (m if m is not None else g)
        assert max(sizes) - min(sizes) <= 1
        total_weight += sum(split.weight(s) for s in sizes)
    # weights sum to W over the ranks: DDP's mean over W ranks gives each sample 1/G
    assert total_weight == pytest.approx(w)


def test_a_share_smaller_than_the_micro_batches_gets_an_empty_one() -> None:
    """micro_batch_size=1 with 64 over 3: 22 micro-batches on every rank; ranks of 21 run one of weight 0."""
    split = BatchSplit(64, 3, 1)
    assert split.micro_steps == 22
    assert split.micro_sizes(21).count(0) == 1 and split.weight(0) == 0.0


def test_even_parts() -> None:
    assert even_parts(22, 3) == (8, 7, 7) and even_parts(3, 5) == (1, 1, 1, 0, 0) and even_parts(6, 2) == (3, 3)


@pytest.mark.parametrize("args, key, words", [
    ((2, None, 3), "recipe.global_batch_size", "2 over world size 3 leaves rank 2 without a sample (2 < 3"),
    ((5, None, 8), "recipe.global_batch_size", "leaves ranks 5-7 without a sample"),
    ((0, None, 1), "recipe.global_batch_size", "must be at least 1, got 0"),
    (("64", None, 1), "recipe.global_batch_size", "must be a whole number, got '64'"),
    ((64, 65, 2), "recipe.micro_batch_size", "65 is larger than the global batch 64"),
    ((64, 0, 2), "recipe.micro_batch_size", "must be a whole number of at least 1, got 0"),
    ((None, 8, 2), "recipe.micro_batch_size", "8 without a global batch"),
])
def test_what_is_refused_names_the_key_and_the_numbers(args, key, words) -> None:
    [problem] = batch_problems(*args)
    assert problem.key == key and words in problem.message and problem.hint


@pytest.mark.parametrize("args", [(64, None, 3), (3, None, 3), (64, 64, 1), (64, 1, 64), (None, None, 4)])
def test_what_runs(args) -> None:
    assert list(batch_problems(*args)) == []
