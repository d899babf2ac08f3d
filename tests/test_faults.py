"""Faults: restarts after a failure resume from the last checkpoint and end where an uninterrupted run
ends (real processes, real gloo groups)."""

from __future__ import annotations

import json

import pytest
import torch

from runs import processes_of, run

pytestmark = pytest.mark.timeout(240)


def flaky(out_dir, *extra: str) -> list[str]:
    return ["recipe=custom", "recipe.target=workloads.flaky:main", f"+recipe.out_dir={out_dir}", "+recipe.steps=30",
            "+recipe.every=4", "+recipe.fail_rank=1", "+recipe.fail_step=13", *extra]


def test_a_restarted_job_resumes_and_ends_with_the_uninterrupted_weights(tmp_path):
    straight, restarted = tmp_path / "straight", tmp_path / "restarted"
    for d in (straight, restarted):
        d.mkdir()
    done = run("topology=1x2", *flaky(straight, "+recipe.fail_attempts=0"), cwd=straight)
    assert done.code == 0, done.output
    done = run("topology=1x2", "launcher.max_restarts=2", *flaky(restarted, "+recipe.fail_attempts=2"), cwd=restarted)
    assert done.code == 0, done.output
    assert "restarting: attempt 2 of 3 (launcher.max_restarts=2)" in done.stderr
    assert "restarting: attempt 3 of 3" in done.stderr
    assert "injected failure at step 13, attempt 0" in done.output
    firsts = {k: json.loads((restarted / f"attempt{k}.json").read_text())["first_step"] for k in range(3)}
    assert firsts == {0: 0, 1: 12, 2: 12}  # from the checkpoint of step 12, nothing lost or done twice
    a, b = torch.load(straight / "final.pt"), torch.load(restarted / "final.pt")
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)
    assert not processes_of(done.run_id)


def test_restarts_run_out(tmp_path):
    done = run("topology=1x2", "launcher.max_restarts=1", *flaky(tmp_path, "+recipe.fail_attempts=5"), cwd=tmp_path)
    assert done.code == 1
    assert done.stderr.count("restarting:") == 1
    assert "injected failure at step 13, attempt 1" in done.output
    assert not processes_of(done.run_id)
