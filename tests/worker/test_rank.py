"""runner.worker.rank, the parts without a process: what a recipe's return value becomes, a rank's own error
record, the order of a recipe's process group calls. (Ranks themselves run in the launcher tests.)"""

from __future__ import annotations

import json
import math
import os

import pytest

from conftest import validate
from runner.environments.process import ProcessEnvironment
from runner.launchers import plan_for
from runner.records.paths import RunPaths
from runner.worker.preparation import rank_setups
from runner.common.signals import StopRequest
from runner.training.output import AgentChannel
from runner.training.progress import StepCount
from runner.worker import rank as rank_module
from runner.worker.rank import RankServices, _plain_result, _run_recipe
from runner.worker.rendezvous import Rendezvous


def test_what_a_recipe_returns_is_kept_as_plain_values() -> None:
    import torch

    kept = _plain_result({"acc": torch.tensor(0.5), "steps": 10, "name": "x", "ok": True, "nan": math.nan,
                          "list": [1, 2], "t": torch.ones(2)})
    assert kept == {"acc": 0.5, "steps": 10, "name": "x", "ok": True}
    assert _plain_result(None) == {} and _plain_result([("a", 1)]) == {} and _plain_result(3.0) == {}


@pytest.mark.unit
def test_a_ranks_error_record(tmp_path) -> None:
    got = validate(("topology=1x2", "device=cpu"))
    paths = RunPaths(tmp_path, "r1")
    plan = plan_for(got.job, paths)
    setup = rank_setups(plan, 0, Rendezvous("env://", "29500", True), paths, ProcessEnvironment.read({}))[1]
    try:
        raise RuntimeError("boom")
    except RuntimeError as e:
        record = setup.error_record(e)
    assert (record.rank, record.local_rank, record.host, record.exception) == (1, 1, "node0", "RuntimeError: boom")
    assert "raise RuntimeError(\"boom\")" in record.traceback and not record.killed
    assert setup.log_file == paths.logs / "rank00001.log" and setup.outcome.rank == 1


def test_no_rank_starts_its_recipe_before_every_rank_has_made_the_process_group(tmp_path, monkeypatch) -> None:
    """gloo lets a rank out of init_process_group once its own side is connected: a recipe that then returned at once
    closed that rank's sockets while a slower rank was still connecting ("Connection closed by peer" in
    connectFullMesh, seen in a full run on a busy machine). The runner's init_process_group ends with torch's
    store-based barrier (TORCH_DIST_INIT_BARRIER=1 for that call alone: no collective, so the recipe's keep their
    numbers, and the recipe's environment is unchanged)."""
    import torch.distributed as dist

    got = validate(("topology=1x2", "device=cpu"))
    paths = RunPaths(tmp_path, "r1")
    setup = rank_setups(plan_for(got.job, paths), 0, Rendezvous("env://", "29500", True), paths,
                        ProcessEnvironment.read({}))[1]
    paths.logs.mkdir(parents=True)
    calls: list[str] = []

    def init(*args, **kwargs) -> None:
        calls.append(f"init with TORCH_DIST_INIT_BARRIER={os.environ.get('TORCH_DIST_INIT_BARRIER')}")

    def recipe(ctx, cfg) -> dict:
        calls.append(f"recipe with TORCH_DIST_INIT_BARRIER={os.environ.get('TORCH_DIST_INIT_BARRIER')}")
        return {}

    monkeypatch.delenv("TORCH_DIST_INIT_BARRIER", raising=False)
    monkeypatch.setattr(dist, "init_process_group", init)
    monkeypatch.setattr(dist, "barrier", lambda *a, **k: calls.append("a collective barrier"))
    monkeypatch.setattr(dist, "is_initialized", lambda: bool(calls))
    monkeypatch.setattr(dist, "get_backend", lambda *a: "gloo")
    monkeypatch.setattr(dist, "destroy_process_group",
                        lambda *a, **k: calls.append(f"destroy, done recorded: {setup.outcome.done}"))
    monkeypatch.setattr(rank_module, "load_target", lambda *a: recipe)
    monkeypatch.setattr(rank_module, "Watch", NoWatch)
    for name in ("init_process_group", "destroy_process_group"):  # what the rank wraps: put back after the test
        monkeypatch.setattr(dist.distributed_c10d, name, getattr(dist.distributed_c10d, name))
    read, write = os.pipe()
    try:
        services = RankServices(agent=AgentChannel(write, False), stop=StopRequest(), steps=StepCount())
        assert _run_recipe(setup, None, services) == 0
        said = os.read(read, 65536).decode().splitlines()
    finally:
        os.close(read)
    # the result is recorded before the group is destroyed: ~ProcessGroupGloo may hang (the agent then ends the rank)
    assert calls == ["init with TORCH_DIST_INIT_BARRIER=1", "recipe with TORCH_DIST_INIT_BARRIER=None",
                     "destroy, done recorded: True"]
    assert setup.outcome.joined
    assert [json.loads(line) for line in said] == [{"k": "life", "event": "joined"}, {"k": "life", "event": "destroyed"}]


class NoWatch:
    def __init__(self, *args, **kwargs) -> None:
        pass

    def begin(self) -> None:
        pass

    def finish(self) -> None:
        pass
