"""runner.spec.place: one descriptor of where a process of a job runs, the same object from the plan to the rank's
setup, its run context and its sharding strategy."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import make_spec, validate
from runner.environments.process import ProcessEnvironment
from runner.launchers import plan_for
from runner.records.paths import RunPaths
from runner.spec.place import RankPlace
from runner.spec.schema import BackendConfig
from runner.worker.preparation import rank_setups
from runner.worker.rendezvous import Rendezvous

PLACE = dict(global_rank=2, local_rank=0, node_rank=1, world_size=4, local_world_size=2, host="b", device="cuda:0",
             device_ids=(0,))


@pytest.mark.unit
def test_a_place_is_frozen_and_built_with_keywords() -> None:
    place = RankPlace(**PLACE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        place.global_rank = 0  # type: ignore[misc]
    with pytest.raises(TypeError):
        RankPlace(*PLACE.values())  # type: ignore[misc]
    assert [f.name for f in dataclasses.fields(RankPlace)] == list(PLACE)


@pytest.mark.unit
def test_the_main_process_is_global_rank_0() -> None:
    assert not RankPlace(**PLACE).is_main
    assert RankPlace(**{**PLACE, "global_rank": 0}).is_main


def test_the_plans_place_is_what_the_rank_its_context_and_its_strategy_read(tmp_path) -> None:
    import torch  # (the run context imports it: not a unit test)

    from runner.training.context import ContextSettings, RunContext

    got = validate(make_spec(devices=[2, 2], names=["a", "b"], addrs=["127.0.0.1", "127.0.0.2"], launcher="manual",
                             backend=BackendConfig(pick_interface=False)))  # no routes asked: no network here
    assert got.valid, got.rendered()
    paths = RunPaths(tmp_path, "r1")
    plan = plan_for(got.job, paths)
    assert {p.world_size for p in plan.records} == {plan.world_size} == {4}
    setup = rank_setups(plan, 1, Rendezvous("env://", "29500", True), paths, ProcessEnvironment.read({}))[1]
    assert setup.place is plan.records[3]
    assert (setup.place.global_rank, setup.place.local_rank, setup.place.node_rank, setup.place.device) == \
        (3, 1, 1, "cpu")
    ctx = RunContext(ContextSettings(place=setup.place, parallel=setup.spec.parallel, sharding=setup.spec.sharding,
                                     global_batch_size=None, seed=0, output_dir=tmp_path,
                                     metrics_file=paths.metrics, checkpoint_dir=paths.checkpoints))
    assert (ctx.rank, ctx.local_rank, ctx.node_rank, ctx.world_size, ctx.local_world_size, ctx.host) == \
        (3, 1, 1, 4, 2, setup.place.host)
    assert ctx.device == torch.device("cpu") and not ctx.is_main
    placement = ctx._sharding.placement  # noqa: SLF001 (the strategy the context made)
    assert placement.place is setup.place and placement.device == torch.device("cpu")
