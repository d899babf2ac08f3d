"""runner.worker.share: one host's share of a job crosses the pipe to the launch agent pickled, whole, and is built
with keywords only; a share restarting itself starts again launcher.max_restarts times (a preflight never), and may
take the ranks' grace, the agent's stop and a margin to end."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import pytest

from conftest import TARGET, environment, make_spec, validate
from runner.launchers import plan_for
from runner.records.paths import RunPaths
from runner.worker.attempt_state import FAILURE_STOP_S, HARD_STOP_MARGIN_S
from runner.worker.share import HostShare, hard_stop_s, restarts_in_place

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


def test_a_share_that_restarts_itself_does_so_max_restarts_times_and_a_preflight_never() -> None:
    spec = make_spec(devices=[1])
    spec.launcher.max_restarts = 3
    assert restarts_in_place(spec) == 3
    assert restarts_in_place(dataclasses.replace(spec, preflight=True)) == 0


@pytest.mark.parametrize("grace_s, expected", [(7.0, 7.0), (0.0, 0.0), (-1.0, 0.0)])
def test_a_share_stops_within_the_ranks_grace_the_agents_stop_and_a_margin(grace_s, expected) -> None:
    launcher = dataclasses.replace(make_spec(devices=[1]).launcher, grace_s=grace_s)
    assert hard_stop_s(launcher) == expected + FAILURE_STOP_S + HARD_STOP_MARGIN_S  # (a negative grace: none)
