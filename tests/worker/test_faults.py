"""Faults: restarts after a failure resume from the last checkpoint and end where an uninterrupted run
ends; hangs end at the timeout naming the ranks that did not arrive; SIGTERM asks for a checkpoint first
(real processes, real gloo groups; the process table is checked after each)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
import uuid

import pytest
import torch

from runs import nothing_left, run, running, signal_when_ready, wait_for_pids

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
    nothing_left(done.run_id)


def test_restarts_run_out(tmp_path):
    done = run("topology=1x2", "launcher.max_restarts=1", *flaky(tmp_path, "+recipe.fail_attempts=5"), cwd=tmp_path)
    assert done.code == 1
    assert done.stderr.count("restarting:") == 1
    assert "injected failure at step 13, attempt 1" in done.output
    nothing_left(done.run_id)


def test_a_host_that_never_comes_is_named_with_its_ranks_at_init_timeout_s_before_any_rank_starts(tmp_path):
    """Host 1 of a manual launch is never started: host 0's agent waits init.timeout_s for it (in the data-network
    check, the first place the hosts meet) and names it with its ranks; no rank starts, to wait as long again."""
    done = run("launcher=manual", "topology=custom", "launcher.manual.host=0", "init.timeout_s=5",
               "topology.hosts=[{name: 127.0.0.1, devices: 2}, {name: 127.0.0.2, devices: 1}]",
               "recipe.global_batch_size=30", cwd=tmp_path)
    assert done.code == 1, done.output
    assert ("error: init: host(s) 1 (127.0.0.2) did not come within init.timeout_s=5 s: rank(s) 2 never started "
            "(before attempt 1, host 0's store heard nothing of their agent)") in done.stderr, done.stderr
    assert "preflight=true" in done.stderr
    assert not list(tmp_path.glob("outputs/*/*/logs/rank*.log"))  # no rank was started
    nothing_left(done.run_id)


def test_sigterm_asks_the_recipe_to_checkpoint_then_stops_every_rank(tmp_path):
    run_id = f"term-{uuid.uuid4().hex[:8]}"
    done = signal_when_ready(["topology=1x2", "recipe.epochs=2000", f"run_id={run_id}"], tmp_path, signal.SIGTERM,
                             "outputs/*/*/metrics.jsonl", timeout=60)
    out, err = done.stdout, done.stderr
    assert done.code == 128 + signal.SIGTERM, err
    assert "SIGTERM: asking 2 process(es) to checkpoint and stop" in err
    assert "stop requested: checkpoint at step" in out
    (checkpoint,) = tmp_path.glob("outputs/*/*/checkpoints/last.pt")
    assert torch.load(checkpoint, weights_only=False)["batch"] > 0  # taken mid-epoch, at the request
    nothing_left(run_id)


def test_a_pinned_port_in_use_moves_to_a_free_one_on_a_single_host(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = run("topology=1x2", "init=tcp", f"init.master_port={port}", "recipe.epochs=1", cwd=tmp_path)
    assert done.code == 0, done.output
    assert f"init.master_port={port} is in use on this machine" in done.stderr


def test_an_unreachable_master_is_a_clear_error_within_the_timeout(tmp_path):
    """Host 1 of a manual launch whose host 0 never starts: the address and port it tried, before any rank."""
    started = time.monotonic()
    done = run("launcher=manual", "topology=custom", "launcher.manual.host=1", "init.timeout_s=3",
               "topology.hosts=[{name: 127.0.0.1, devices: 1}, {name: 127.0.0.2, devices: 1}]",
               "recipe.global_batch_size=2", cwd=tmp_path)
    assert done.code == 1, done.output
    assert "the master 127.0.0.1:" in done.stderr and "cannot be reached from this host" in done.stderr
    assert "refused the connection for 3 s" in done.stderr
    # init.timeout_s is honoured (the line above), not the default 300 s: the margin is for `run`'s start on a loaded
    # machine (18 s was once exceeded by 1 s with the suite and more on 2 cores), not a speed target
    assert time.monotonic() - started < 3 + 60
    assert not list(tmp_path.glob("outputs/*/*/logs/rank*.log"))  # no rank was started


def test_a_rank_killed_with_sigkill_ends_the_job(tmp_path):
    art = tmp_path / "art"
    art.mkdir()
    run_id = f"kill-{uuid.uuid4().hex[:8]}"
    with running("topology=1x3", "recipe.global_batch_size=3", "recipe=custom", "recipe.target=workloads.failing:main",
                 f"+recipe.out_dir={art}", "+recipe.fail_rank=-1", "+recipe.fail_step=0", "init.timeout_s=300",
                 run_id=run_id, cwd=tmp_path) as proc:
        os.kill(wait_for_pids(proc, art, 3)[1], signal.SIGKILL)
        started = time.monotonic()
        done = proc.wait(30)
    err = done.stderr
    assert done.code == 1, err
    assert "rank 1 (host node0) failed first: killed by SIGKILL (no Python exception: killed from outside" in err
    # the others either noticed the lost peer (listed after it) or were stopped first: each is said once
    after = err.split("failed first", 1)[1]
    listed = re.findall(r"^  rank (\d+) \(host node0\): ", after, flags=re.M)
    stopped = re.search(r"^  (\d+) other process\(es\) were stopped by the host agent$", after, flags=re.M)
    assert set(map(int, listed)) <= {0, 2} and len(listed) + (int(stopped.group(1)) if stopped else 0) == 2, err
    assert time.monotonic() - started < 30  # the others stopped at once: not at init.timeout_s=300
    nothing_left(run_id)
