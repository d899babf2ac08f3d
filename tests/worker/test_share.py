"""runner.worker.share: one host's share of a job crosses the pipe to the launch agent pickled, whole, and is built
with keywords only."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from conftest import TARGET, environment, validate
from runner.launchers import plan_for
from runner.records.paths import RunPaths
from runner.worker.share import HostShare

pytestmark = pytest.mark.unit


def _share() -> HostShare:
    paths = RunPaths(Path("/runs/R1"), "R1")
    job = validate((f"recipe.target={TARGET}", "topology=1x2", "device=cpu", "launcher.max_restarts=2")).job
    return HostShare(plan=plan_for(job, paths), node_rank=0, paths=paths,
                     environment=environment(HOME="/home/u"), restarts=job.spec.launcher.max_restarts)


def test_a_share_crosses_a_pipe_whole() -> None:
    share = _share()
    back = pickle.loads(pickle.dumps(share))
    assert back == share and back is not share
    assert ([r.global_rank for r in back.plan.host_records(0)], back.restarts, back.paths.root) == ([0, 1], 2, Path("/runs/R1"))


def test_a_share_is_built_with_keywords_and_not_changed_after() -> None:
    share = _share()
    with pytest.raises(TypeError):
        HostShare(share.plan, 0, share.paths, share.environment)  # type: ignore[misc]
    with pytest.raises(AttributeError):
        share.node_rank = 1  # type: ignore[misc]
