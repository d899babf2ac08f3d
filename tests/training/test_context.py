"""runner.training.context: what a recipe reads of its place, built from the worker's settings."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runner.api import Recipe, RunContext
from runner.spec.schema import ParallelConfig, ShardingConfig, ShardingMode
from runner.training.context import ContextSettings

pytestmark = pytest.mark.unit


def _context(tmp_path: Path, **kw) -> RunContext:
    settings = dict(rank=3, local_rank=1, node_rank=1, world_size=4, local_world_size=2, host="b",
                    device=torch.device("cpu"), device_ids=(), parallel=ParallelConfig(),
                    sharding=ShardingConfig(mode=ShardingMode.zero), global_batch_size=8, seed=7, output_dir=tmp_path,
                    metrics_file=tmp_path / "m.jsonl", checkpoint_dir=tmp_path / "ck", attempt=2)
    settings.update(kw)
    return RunContext(ContextSettings(**settings))


def test_where_the_process_is(tmp_path) -> None:
    ctx = _context(tmp_path)
    assert (ctx.rank, ctx.local_rank, ctx.node_rank, ctx.world_size, ctx.local_world_size, ctx.host) == (3, 1, 1, 4, 2, "b")
    assert not ctx.is_main and ctx.sharding_mode == "zero" and ctx.per_process_batch_size == 2
    assert (ctx.attempt, ctx.seed, ctx.output_dir, ctx.checkpoint_dir) == (2, 7, tmp_path, tmp_path / "ck")
    assert not hasattr(ctx, "place") and not hasattr(ctx, "strategy")  # internals are not the API


def test_metrics_go_to_the_file_the_worker_names(tmp_path) -> None:
    ctx = _context(tmp_path, rank=0)
    ctx.log(5, echo=False, loss=0.25)
    ctx.close()
    assert '"loss": 0.25' in (tmp_path / "m.jsonl").read_text()


def test_a_function_of_ctx_and_cfg_is_a_recipe() -> None:
    def main(ctx: RunContext, cfg) -> dict:
        return {}

    recipe: Recipe = main
    assert recipe(None, None) == {}
