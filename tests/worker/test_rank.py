"""runner.worker.rank, the parts without a process: what a recipe's return value becomes, and a rank's own
error record. (Ranks themselves run in the launcher tests.)"""

from __future__ import annotations

import math

import pytest
import torch

from conftest import validate
from runner.environments.process import ProcessEnvironment
from runner.launchers import plan_for
from runner.records.paths import RunPaths
from runner.worker.host_agent import rank_setups
from runner.worker.rank import _plain_result
from runner.worker.rendezvous import Rendezvous

pytestmark = pytest.mark.unit


def test_what_a_recipe_returns_is_kept_as_plain_values() -> None:
    kept = _plain_result({"acc": torch.tensor(0.5), "steps": 10, "name": "x", "ok": True, "nan": math.nan,
                          "list": [1, 2], "t": torch.ones(2)})
    assert kept == {"acc": 0.5, "steps": 10, "name": "x", "ok": True}
    assert _plain_result(None) == {} and _plain_result([("a", 1)]) == {} and _plain_result(3.0) == {}


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
