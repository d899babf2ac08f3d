"""runner.training.collectives: at world size 1, or without a process group, each collective is this process's
own answer; with a group (one gloo rank here; several: test_should_stop_across_ranks.py), the group's."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from runner.training.collectives import Collectives


def test_alone_each_collective_is_this_processs_own_answer() -> None:
    alone = Collectives(torch.device("cpu"), world_size=1)
    assert alone.mean(2.5) == 2.5 and alone.mean(torch.tensor(4)) == 4.0
    assert alone.any_of(True) and not alone.any_of(False)
    alone.barrier()  # nothing to wait for


def test_a_world_that_has_no_process_group_yet_is_not_waited_for() -> None:
    assert not dist.is_initialized()
    ungrouped = Collectives(torch.device("cpu"), world_size=4)
    assert ungrouped.mean(3.0) == 3.0 and ungrouped.any_of(True)
    ungrouped.barrier()


def test_in_a_process_group_the_groups_answer(tmp_path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        grouped = Collectives(torch.device("cpu"), world_size=2)  # as a rank of 2 would, over a group of 1
        assert grouped.mean(3.0) == 1.5  # the sum over the group, over the world size
        assert grouped.any_of(True) and not grouped.any_of(False)
        grouped.barrier()
    finally:
        dist.destroy_process_group()
