"""launcher=slurm on a real two-node Slurm cluster (scripts/testbed.py: slurmctld, one slurmd per
network-namespace host, munge): sbatch from the "login node" followed to its end, srun steps inside
salloc, both task modes, every init method, a 2+1 job, refused mismatches, and preemption with
checkpoint, requeue and resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch

from runs import SNAPSHOT, artifacts, check_views, nothing_left, run, run_folder, running, wait_until

pytestmark = pytest.mark.timeout(300)


def placement(out_dir: Path, *extra: str) -> list[str]:
    return ["recipe=custom", "recipe.target=workloads.placement:main", f"+recipe.out_dir={out_dir}", *extra]


def salloc(testbed, nodes: int, per_node: int) -> tuple[str, ...]:
    return ("salloc", f"--nodes={nodes}", f"--ntasks-per-node={per_node}", f"--partition={testbed.partition}")


def check_ranks(testbed, art: Path, counts: list[int]) -> dict[int, dict]:
    """Every rank ran on the node the plan gave it (node i: counts[i] ranks, on the testbed's hosts, each
    with that host's address) and the all-reduce across the nodes summed 1 + ... + world."""
    found = artifacts(art)
    world = sum(counts)
    assert sorted(found) == list(range(world))
    by_node: dict[str, list[int]] = {}
    for rank, rec in found.items():
        by_node.setdefault(rec["node"], []).append(rank)
        assert rec["sum"] == world * (world + 1) / 2, rec
        assert rec["world_size"] == world
    assert sorted(len(r) for r in by_node.values()) == sorted(counts)
    hosts = {h.name: h for h in testbed.hosts}
    assert set(by_node) <= set(hosts) and len(by_node) == len(counts), by_node
    for node, ranks in by_node.items():
        for rank in ranks:
            assert hosts[node].addr in found[rank]["addrs"], (node, found[rank])
    first = found[0]["node"]
    assert all(found[r]["master_addr"] in (first, hosts[first].addr, None) for r in found)
    return found


def test_sbatch_2x2_file_init_per_host(testbed, tmp_path):
    """The line users type most: `run topology=2x2 init=file launcher=slurm`, from the login node."""
    art = tmp_path / "art"
    art.mkdir()
    done = run("topology=2x2", "init=file", "launcher=slurm", *placement(art), cwd=tmp_path, env=testbed.env())
    assert done.code == 0, done.output
    assert "slurm: submitted job" in done.stderr and "COMPLETED" in done.stderr
    check_ranks(testbed, art, [2, 2])
    folder = run_folder(tmp_path)
    check_views(art, folder / "spec.yaml", 4)
    job_id = (folder / "slurm_job_id").read_text().strip()
    assert (folder / f"slurm-{job_id}.out").exists()
    assert sorted(p.name for p in (folder / "logs").glob("rank*.log")) == [f"rank{r:05d}.log" for r in range(4)]
    assert "network: GLOO_SOCKET_IFNAME=" in (folder / "logs" / "rank00002.log").read_text()


@pytest.mark.parametrize("init, tasks, how", [  # with test_sbatch_2x2_file_init_per_host: each init method under
    ("tcp", "per_host", "sbatch"),               # sbatch and inside salloc, each task mode under both
    ("env", "per_device", "sbatch"),
    ("env", "per_host", "salloc"),
    ("tcp", "per_device", "salloc"),
    ("file", "per_device", "salloc"),
])
def test_2x2_every_init_and_task_mode(testbed, tmp_path, init, tasks, how):
    art = tmp_path / "art"
    art.mkdir()
    prefix = salloc(testbed, 2, 2) if how == "salloc" else ()
    done = run("topology=2x2", f"init={init}", "launcher=slurm", f"launcher.tasks={tasks}", *placement(art),
               *SNAPSHOT, cwd=tmp_path, env=testbed.env(), prefix=prefix)
    assert done.code == 0, done.output
    assert ("an srun step in job" in done.stderr) == (how == "salloc")
    check_ranks(testbed, art, [2, 2])
    views = check_views(art, run_folder(tmp_path) / "spec.yaml", 4)
    assert views[0]["code"] == str(run_folder(tmp_path) / "code")


def test_heterogeneous_2_plus_1_one_task_per_device(testbed, tmp_path):
    art = tmp_path / "art"
    art.mkdir()
    done = run("topology=hetero_2_1", "launcher=slurm", "launcher.tasks=per_device", "recipe.global_batch_size=60",
               *placement(art), cwd=tmp_path, env=testbed.env())
    assert done.code == 0, done.output
    found = check_ranks(testbed, art, [2, 1])
    assert [found[r]["node"] == found[0]["node"] for r in range(3)] == [True, True, False]  # ranks 0, 1 | 2
    assert "can't honor" not in done.output


def test_an_allocation_too_small_is_refused_before_any_step(testbed, tmp_path):
    art = tmp_path / "art"
    art.mkdir()
    done = run("topology=2x2", "launcher=slurm", *placement(art), cwd=tmp_path, env=testbed.env(),
               prefix=salloc(testbed, 1, 1))
    assert done.code == 2, done.output
    assert "has 1 node(s) (SLURM_JOB_NUM_NODES), the spec needs 2" in done.stderr
    assert "salloc --nodes=2" in done.stderr and "nothing was started" in done.stderr
    assert "Traceback" not in done.output
    assert not list((run_folder(tmp_path) / "logs").iterdir()) and not artifacts(art)


def test_a_step_shaped_unlike_the_plan_is_refused_by_its_tasks(testbed, tmp_path):
    """A user's own srun line that does not match the spec: each task says both numbers, no rank starts."""
    art = tmp_path / "art"
    art.mkdir()
    dry = run("topology=2x2", "launcher=slurm", "launcher.tasks=per_device", *placement(art), "dry_run=true",
              cwd=tmp_path, env=testbed.env())
    assert dry.code == 0, dry.output
    spec = run_folder(tmp_path) / "spec.yaml"
    step = subprocess.run(["srun", "--nodes=2", "--ntasks=3", f"--partition={testbed.partition}", sys.executable,
                           "-P", "-m", "runner.app.task", str(spec)], env=testbed.env(),
                          capture_output=True, text=True, timeout=120)
    assert step.returncode != 0
    # the count is checked before the placement: 3 tasks are refused as 3, whichever nodes they are on
    said = ("Slurm started 3 task(s), but the spec needs 4 (launcher.tasks=per_device: one task per process); hint: "
            "start the job with the command `run` printed (launch.txt), or change the spec to this allocation")
    assert step.stderr.count(said) == 3, step.stderr  # each task
    assert "Traceback" not in step.stderr and not artifacts(art)


def test_preemption_checkpoints_requeues_and_resumes(testbed, tmp_path):
    """Slurm's time-limit signal (sent here with scancel, as slurmctld sends it) reaches the recipe as a
    stop request: it checkpoints, the batch script requeues the job, and the next attempt resumes from
    the checkpoint and ends with the weights of an uninterrupted run."""
    overrides = ("topology=2x2", "launcher=slurm", "launcher.slurm.requeue=true", "recipe.epochs=20",
                 "recipe.stop_check_every=1")
    run_id = f"preempt-{uuid.uuid4().hex[:8]}"
    with running(*overrides, run_id=run_id, cwd=tmp_path, env=testbed.env(), merged=True) as proc:
        wait_until(lambda: list(tmp_path.glob("outputs/*/*/metrics.jsonl")), 120, "the first metrics", alive=[proc])
        folder = run_folder(tmp_path)
        job_id = (folder / "slurm_job_id").read_text().strip()
        subprocess.run(["scancel", "--batch", "--signal=USR1", job_id], env=testbed.env(), check=True)
        out = proc.wait(240).output
    assert proc.returncode == 0, out
    assert "asking the ranks to checkpoint and stop" in out and "requeueing job" in out
    assert "run stopped on request (checkpoint and stop): 2 process(es) on node0" in out
    assert "restart 1" in out and "COMPLETED" in out
    resumed = [line for line in out.splitlines() if line.startswith("resumed from")]
    assert resumed and "checkpoints/last.pt" in resumed[0], out
    stopped_at = int(resumed[0].split("step ")[1].split(",")[0])
    assert 0 < stopped_at < 20 * 21  # stopped mid-training (21 steps per epoch at global batch 64)
    final = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()][-1]
    assert final["final"] and final["steps"] == 20 * 21 and final["test_accuracy"] > 0.95

    # the same job, uninterrupted, on this machine's CPUs: the same weights
    ref = tmp_path / "ref"
    ref.mkdir()
    done = run("topology=1x4", "recipe.epochs=20", cwd=ref)
    assert done.code == 0, done.output
    resumed_state = torch.load(folder / "checkpoints" / "last.pt", weights_only=False)["model"]
    straight = torch.load(run_folder(ref) / "checkpoints" / "last.pt", weights_only=False)["model"]
    for key in straight:
        torch.testing.assert_close(resumed_state[key], straight[key], rtol=1e-5, atol=1e-6)
    nothing_left(run_id)


def test_the_stop_signal_to_run_checkpoints_and_ends_the_job_it_follows_not_requeued(testbed, tmp_path):
    """kill -USR1 <pid of run> while it follows its Slurm job (docs/launchers.md: under any launcher): `run` passes it on to
    the batch script (scancel --signal=USR1 --batch), the ranks checkpoint and return, and the job ends: with
    launcher.slurm.requeue=true too, it is not requeued (the stop was the user's, not Slurm's time limit). `run`
    exits 0 and its summary says the ranks stopped on request."""
    run_id = f"usrstop-{uuid.uuid4().hex[:8]}"
    overrides = ("topology=2x1", "launcher=slurm", "launcher.slurm.requeue=true", "recipe.epochs=1000",
                 "recipe.stop_check_every=1")
    job_id = None
    try:
        with running(*overrides, run_id=run_id, cwd=tmp_path, env=testbed.env()) as proc:
            # trained some steps: the first metrics row (epoch 5), written once the job runs on the nodes
            wait_until(lambda: list(tmp_path.glob("outputs/*/*/metrics.jsonl")), 120, "the job trained 5 epochs",
                       alive=[proc])
            folder = run_folder(tmp_path)
            job_id = (folder / "slurm_job_id").read_text().strip()
            os.kill(proc.pid, signal.SIGUSR1)  # `run`'s own pid, as a user would
            done = proc.wait(120)
    finally:
        if job_id:
            subprocess.run(["scancel", job_id], env=testbed.env())  # nothing left on the cluster, whatever happened
    stdout, stderr = done.stdout, done.stderr
    assert done.code == 0, stdout + stderr
    assert (f"SIGUSR1: asking Slurm job {job_id} to checkpoint and stop (scancel --signal=USR1 --batch {job_id})"
            in stderr), stderr
    assert f"slurm job {job_id}: COMPLETED" in stderr and "cancelling" not in stderr
    assert "run: SIGUSR1 from Slurm: asking the ranks to checkpoint and stop" in stdout
    assert f"run: stopped at the user's request (user_stop): job {job_id} ends, not requeued" in stdout
    assert "requeueing" not in stdout and "restart 1" not in stderr
    # the checkpoint the stop wrote: mid-epoch, at the step rank 0 said
    said = [line for line in stdout.splitlines() if line.startswith("stop requested: checkpoint at step")]
    assert said, stdout
    step = int(said[0].split("step ")[1].split(" ")[0])
    checkpoint = torch.load(folder / "checkpoints" / "last.pt", weights_only=True)
    assert (checkpoint["step"], "batch" in checkpoint) == (step, True) and 0 < step < 1000 * 21
    for rank in range(2):
        assert json.loads((folder / "logs" / f"rank{rank:05d}.done").read_text())["stopped"] is True
    assert "status    stopped on request (" in stderr
    assert json.loads((folder / "run_summary.json").read_text())["status"] == "stopped"
    assert "SIGUSR1" in (folder / "user_stop").read_text()
    queue = subprocess.run(["squeue", "-h", "-j", job_id], env=testbed.env(), capture_output=True, text=True)
    assert not queue.stdout.strip(), queue.stdout  # ended, not requeued
    nothing_left(run_id)


@pytest.mark.parametrize("tasks", ["per_host", "per_device"])
def test_a_failing_rank_ends_the_job_with_its_traceback(testbed, tmp_path, tasks):
    art = tmp_path / "art"
    art.mkdir()
    started = time.monotonic()
    done = run("topology=2x2", "launcher=slurm", f"launcher.tasks={tasks}", "recipe=custom",
               "recipe.target=workloads.failing:main", f"+recipe.out_dir={art}", "+recipe.fail_rank=3",
               "+recipe.fail_step=5", cwd=tmp_path, env=testbed.env())
    assert done.code == 1, done.output
    assert "RuntimeError: injected failure on rank 3 at step 5" in done.output
    assert time.monotonic() - started < 60
    nothing_left(done.run_id)
