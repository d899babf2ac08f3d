"""runner.training.context: ctx.setup with the optimizer it builds, in this process (an optimizer's first build imports
torch._dynamo, 0.9 CPU-s: apart from the rest of the context, in test_context.py, so that the tests that build none
need not import it)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from torch import nn

from runner.api import single_process_context
from runner.records.paths import RunPaths
from runner.spec.schema import ShardingConfig
from test_context import rank_context

pytestmark = pytest.mark.usefixtures("optimizers_imported")


# ---------------------------------------------------------------------------------------------- the optimizer


def _groups(model: nn.Module) -> list[dict]:
    """AdamW's usual groups: weight decay on matrices, none on biases and norms."""
    matrices = [p for p in model.parameters() if p.ndim >= 2]
    others = [p for p in model.parameters() if p.ndim < 2]
    return [{"params": matrices, "weight_decay": 0.1}, {"params": others, "weight_decay": 0.0}]


def test_make_optimizer_builds_parameter_groups(tmp_path) -> None:
    ctx = rank_context(tmp_path, rank=0, world_size=1, sharding=ShardingConfig())
    model, optimizer = ctx.setup(nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)),
                                 make_optimizer=lambda m: torch.optim.AdamW(_groups(m), lr=0.01))
    assert type(optimizer) is torch.optim.AdamW
    assert [(len(g["params"]), g["weight_decay"]) for g in optimizer.param_groups] == [(1, 0.1), (3, 0.0)]


def test_setup_says_how_it_is_called(tmp_path) -> None:
    ctx = rank_context(tmp_path, rank=0, world_size=1)
    with pytest.raises(TypeError, match="not neither"):
        ctx.setup(nn.Linear(2, 2))
    with pytest.raises(TypeError, match="not both"):
        ctx.setup(nn.Linear(2, 2), torch.optim.SGD, make_optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=1))
    with pytest.raises(TypeError, match=r"takes no optimizer arguments \(got lr\)"):
        ctx.setup(nn.Linear(2, 2), make_optimizer=lambda m: torch.optim.SGD(m.parameters()), lr=1)
    with pytest.raises(TypeError, match="make_optimizer returned list, not a torch.optim.Optimizer"):
        ctx.setup(nn.Linear(2, 2), make_optimizer=lambda m: list(m.parameters()))


def test_a_single_process_context_is_rank_0_of_1_in_a_run_folder(tmp_path) -> None:
    cfg = OmegaConf.create({"global_batch_size": 12, "seed": 3})
    with single_process_context(cfg, tmp_path / "run") as ctx:
        assert (ctx.rank, ctx.world_size, ctx.is_main, ctx.per_process_batch_size, ctx.seed) == (0, 1, True, 12, 3)
        assert ctx.device == torch.device("cpu") and ctx.sharding_mode == "none" and ctx.attempt == 0
        paths = RunPaths(tmp_path / "run", "x")
        assert (ctx.output_dir, ctx.checkpoint_dir) == (paths.root, paths.checkpoints)  # where a run puts them
        assert torch.initial_seed() == 3  # seeded as the worker seeds a rank
        ctx.log(1, echo=False, loss=0.5)
        model, optimizer = ctx.setup(nn.Linear(2, 2), torch.optim.SGD, lr=0.1)
        assert type(model) is nn.Linear and not dist.is_initialized()
    assert '"loss": 0.5' in paths.metrics.read_text()
