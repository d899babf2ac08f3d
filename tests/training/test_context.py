"""runner.training.context: what a recipe reads of its place, built from the worker's settings."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset

from runner.api import Recipe, RunContext, single_process_context
from runner.common.signals import StopRequest
from runner.spec.place import RankPlace
from runner.spec.schema import ParallelConfig, ShardingConfig, ShardingMode
from runner.training.context import ContextSettings


def rank_context(tmp_path: Path, *, rank: int = 3, world_size: int = 4, **kw) -> RunContext:
    place = RankPlace(global_rank=rank, local_rank=1, node_rank=1, world_size=world_size, local_world_size=2, host="b",
                      device="cpu", device_ids=())
    settings = dict(place=place, parallel=ParallelConfig(),
                    sharding=ShardingConfig(mode=ShardingMode.zero), global_batch_size=8, seed=7, output_dir=tmp_path,
                    metrics_file=tmp_path / "m.jsonl", checkpoint_dir=tmp_path / "ck", attempt=2)
    settings.update(kw)
    return RunContext(ContextSettings(**settings))


def test_where_the_process_is(tmp_path) -> None:
    ctx = rank_context(tmp_path)
    assert (ctx.rank, ctx.local_rank, ctx.node_rank, ctx.world_size, ctx.local_world_size, ctx.host) == (3, 1, 1, 4, 2, "b")
    assert ctx.device == torch.device("cpu") and isinstance(ctx.device, torch.device)
    assert not ctx.is_main and ctx.sharding_mode == "zero" and ctx.per_process_batch_size == 2
    assert (ctx.attempt, ctx.seed, ctx.output_dir, ctx.checkpoint_dir) == (2, 7, tmp_path, tmp_path / "ck")
    assert not hasattr(ctx, "place") and not hasattr(ctx, "strategy")  # internals are not the API


def test_metrics_go_to_the_file_the_worker_names(tmp_path) -> None:
    ctx = rank_context(tmp_path, rank=0)
    ctx.log(5, echo=False, loss=0.25)
    ctx._close()  # what the worker does when the recipe returns
    assert '"loss": 0.25' in (tmp_path / "m.jsonl").read_text()


def test_a_recipe_is_called_with_the_context_and_the_config_and_the_bundled_one_takes_them() -> None:
    """Recipe's call takes the context and the config, in that order, positionally (the worker calls
    ``recipe(ctx, cfg)``), and may return final metrics; the bundled recipe takes exactly that call."""
    from runner.recipes.digits import main

    call = inspect.signature(Recipe.__call__)
    assert [(p.name, p.kind, p.annotation) for p in list(call.parameters.values())[1:]] == [
        ("ctx", inspect.Parameter.POSITIONAL_ONLY, "RunContext"), ("cfg", inspect.Parameter.POSITIONAL_ONLY, "DictConfig")]
    assert call.return_annotation == "Mapping[str, Any] | None"
    inspect.signature(main).bind(object(), object())  # TypeError if it could not be called so
    with pytest.raises(TypeError):
        inspect.signature(main).bind(object())


@pytest.mark.parametrize("name", ["rank", "local_rank", "node_rank", "world_size", "local_world_size", "host",
                                  "is_main", "device", "seed", "attempt", "output_dir", "global_batch_size",
                                  "per_process_batch_size", "sharding_mode", "checkpoint_dir", "stop_requested"])
def test_what_the_context_says_of_the_job_is_read_only(tmp_path, name) -> None:
    with pytest.raises(AttributeError):
        setattr(rank_context(tmp_path), name, getattr(rank_context(tmp_path), name))


# ---------------------------------------------------------------------------------------------- the global batch


@pytest.mark.parametrize("world, batch, each", [(1, 64, 64), (2, 64, 32), (4, 64, 16), (3, 63, 21)])
def test_the_per_process_batch_is_the_global_batch_over_the_world_size(tmp_path, world, batch, each) -> None:
    assert rank_context(tmp_path, rank=0, world_size=world, global_batch_size=batch).per_process_batch_size == each


def test_a_context_without_a_global_batch_says_which_key_to_set(tmp_path) -> None:
    with pytest.raises(ValueError, match="recipe.global_batch_size is not set"):
        _ = rank_context(tmp_path, global_batch_size=None).per_process_batch_size


@pytest.mark.parametrize("world", [2, 4])
def test_the_ranks_batches_together_are_the_global_batch_of_one_process(tmp_path, world) -> None:
    """Global batch b is the same samples at every world size: rank r takes every world-th of them."""
    data = TensorDataset(torch.arange(48))

    def batches(rank: int, size: int) -> list[list[int]]:
        loader = rank_context(tmp_path, rank=rank, world_size=size, global_batch_size=8, seed=5).loader(data)
        loader.sampler.set_epoch(1)
        return [batch.tolist() for (batch,) in loader]

    alone = batches(0, 1)
    shares = [batches(r, world) for r in range(world)]
    assert len(alone) == 6 and all(len(s) == 6 for s in shares)
    for b, whole in enumerate(alone):
        assert sorted(x for share in shares for x in share[b]) == sorted(whole)
        assert all(len(share[b]) == 8 // world for share in shares)


# ---------------------------------------------------------------------------------------------- stopping


@pytest.mark.parametrize("every, answers", [(1, [True, True, True]), (3, [False, False, True, False, False, True]),
                                            (0, [True, True])])
def test_should_stop_agrees_on_every_nth_call_only(tmp_path, every, answers) -> None:
    asked = StopRequest()
    asked.requested = True
    ctx = rank_context(tmp_path, rank=0, world_size=1, stop=asked)
    assert [ctx.should_stop(every=every) for _ in answers] == answers
    assert ctx.stop_requested


def test_should_stop_is_false_without_a_request(tmp_path) -> None:
    ctx = rank_context(tmp_path, rank=0, world_size=1)
    assert not any(ctx.should_stop() for _ in range(3)) and not ctx.stop_requested


# ---------------------------------------------------------------------------------------------- checkpoints


def test_the_checkpoint_to_resume_from(tmp_path) -> None:
    """The run's own checkpoint wins over the fallback (recipe.resume); a missing fallback is an error; else None."""
    ctx = rank_context(tmp_path, rank=0, world_size=1)
    other = tmp_path / "other.pt"
    assert ctx.checkpoint_to_resume() is None and ctx.checkpoint_to_resume(fallback=None) is None
    with pytest.raises(FileNotFoundError, match="no checkpoint at .*other.pt .*the fallback to resume from"):
        ctx.checkpoint_to_resume(fallback=other)
    torch.save({"step": 1}, other)
    assert ctx.checkpoint_to_resume(fallback=str(other)) == other
    own = ctx.save_checkpoint({"step": 2})
    assert own == tmp_path / "ck" / "last.pt" and ctx.checkpoint_to_resume(fallback=other) == own
    assert ctx.load_checkpoint(path=ctx.checkpoint_to_resume(fallback=other)) == {"step": 2}
    assert ctx.load_checkpoint("missing") is None


# ---------------------------------------------------------------------------------------------- one process


def test_a_single_process_context_without_a_folder_makes_and_removes_one() -> None:
    with single_process_context() as ctx:
        folder = ctx.output_dir
        ctx.save_checkpoint({"step": 1})
        assert (folder / "checkpoints" / "last.pt").exists()
    assert not folder.exists()


def test_a_single_process_context_can_make_a_one_rank_process_group(tmp_path) -> None:
    with single_process_context(None, tmp_path, process_group=True) as ctx:
        assert dist.is_initialized() and dist.get_world_size() == 1 and dist.get_backend() == "gloo"
        assert ctx.mean(3.0) == 3.0
        ctx.barrier()
    assert not dist.is_initialized()
