"""launcher=local end to end: real `run` processes, real gloo process groups, artifacts per rank."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from runner.common.owned_folders import remove_abandoned
from runner.records.paths import RunPaths
from runs import (SNAPSHOT, artifacts, check_views, finish, nothing_left, run, run_folder, running, started,
                  user_env, wait_for_pids)

pytestmark = pytest.mark.timeout(240)


_low, _high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
EPHEMERAL_PORTS = range(_low, _high + 1)  # where a port bound as 0 comes from


def custom(target: str, out_dir, *extra: str) -> list[str]:
    return ["recipe=custom", f"recipe.target={target}", f"+recipe.out_dir={out_dir}", *extra]


def until_stopped(out_dir) -> list[str]:
    """Ranks that write their pid (runs.wait_for_pids) and all-reduce until stopped."""
    return custom("workloads.failing:main", out_dir, "+recipe.fail_rank=-1", "+recipe.fail_step=0")


@pytest.mark.parametrize("shape,world", [("1x1", 1), ("1x2", 2), ("1x4", 4)])
def test_every_rank_runs_and_all_reduces(tmp_path, shape, world):
    art = tmp_path / "art"
    art.mkdir()
    done = run(f"topology={shape}", *custom("workloads.artifact:main", art, "+recipe.wrap=true"), cwd=tmp_path,
               env=user_env(shared_cores=False))  # the runner's own threads
    assert done.code == 0, done.output
    found = artifacts(art)
    assert sorted(found) == list(range(world))
    for rank, rec in found.items():
        assert rec["world_size"] == world and rec["local_rank"] == rank
        assert rec["sum"] == world * (world + 1) / 2  # every rank took part in the all-reduce
        assert rec["backend"] == "gloo" and rec["device"] == "cpu"
        assert rec["per_process_batch"] == 64 // world
        assert rec["wrapped"] == ("DistributedDataParallel" if world > 1 else "Linear")
        env = rec["env"]
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["GROUP_RANK"]) == \
            (str(rank), str(rank), str(world), str(world), "0")
        assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) in EPHEMERAL_PORTS  # the kernel's choice
        # the rank's torch thread pool follows its share of the cores, though torch was imported before fork
        assert rec["torch_threads"] == int(env["OMP_NUM_THREADS"]) == max(1, (os.cpu_count() or 1) // world)
    assert len({rec["env"]["MASTER_PORT"] for rec in found.values()}) == 1
    folder = run_folder(tmp_path)
    assert sorted(p.name for p in (folder / "logs").glob("rank*.log")) == [f"rank{r:05d}.log" for r in range(world)]
    nothing_left(done.run_id)


@pytest.mark.parametrize("method", ["env", "tcp", "file"])
def test_init_methods(tmp_path, method):
    """Each init method, in a run without a run id (the launch picks one) and with a snapshot of the code: every rank
    sees the one spec spec.yaml holds (the run id it was given, the code's copy)."""
    art = tmp_path / "art"
    art.mkdir()
    done = run("topology=1x2", f"init={method}", *custom("workloads.artifact:main", art), "run_id=null", *SNAPSHOT,
               cwd=tmp_path)
    assert done.code == 0, done.output
    assert sorted(artifacts(art)) == [0, 1]
    assert all(rec["sum"] == 3.0 for rec in artifacts(art).values())
    views = check_views(art, run_folder(tmp_path) / "spec.yaml", 2)
    assert views[0]["code"] == str(run_folder(tmp_path) / "code")
    plan = json.loads((run_folder(tmp_path) / "plan.json").read_text())
    assert plan["init_method"].startswith({"env": "env://", "tcp": "tcp://127.0.0.1:", "file": "file:///"}[method])
    assert not list(run_folder(tmp_path).glob("*.rdzv")), "the init file (and its folder) must be removed after the run"


def test_the_init_file_lives_in_a_folder_only_the_user_can_enter(tmp_path):
    art = tmp_path / "art"
    art.mkdir()
    done = run("topology=1x2", "init=file", "recipe=custom", "recipe.target=workloads.rdzv_mode:main",
               f"+recipe.out_dir={art}", cwd=tmp_path)
    assert done.code == 0, done.output
    assert json.loads((art / "mode.json").read_text()) == {"folder_mode": "0o700"}


def test_two_runs_get_their_own_ports(tmp_path):
    arts = [tmp_path / "a", tmp_path / "b"]
    for art in arts:
        art.mkdir()
    with running("topology=1x2", *custom("workloads.artifact:main", arts[0]), cwd=tmp_path) as a, \
            running("topology=1x2", *custom("workloads.artifact:main", arts[1]), cwd=tmp_path) as b:
        done = [a.wait(120), b.wait(120)]
    assert [d.code for d in done] == [0, 0], [d.output for d in done]
    ports = {artifacts(a)[0]["env"]["MASTER_PORT"] for a in arts}
    assert len(ports) == 2


def test_existing_init_file_is_never_reused(tmp_path):
    rdzv = tmp_path / "rdzv"
    rdzv.mkdir()
    (rdzv / "stale1.rdzv").mkdir()
    (rdzv / "stale1.rdzv" / "attempt0").write_text("left over from an earlier run")
    done = run("init=file", f"init.dir={rdzv}", "run_id=stale1", *custom("workloads.artifact:main", tmp_path),
               cwd=tmp_path)
    assert done.code == 2
    assert "already exists" in done.stderr and "stale1.rdzv" in done.stderr
    assert "Traceback" not in done.output
    assert (rdzv / "stale1.rdzv" / "attempt0").read_text() == "left over from an earlier run"
    assert not list(tmp_path.glob("rank*.json"))


def test_dp_runs_one_process(tmp_path):
    art = tmp_path / "art"
    art.mkdir()
    done = run("topology=1x2", "parallel=dp", *custom("workloads.artifact:main", art), cwd=tmp_path)
    assert done.code == 0, done.output
    (rec,) = artifacts(art).values()
    assert rec["world_size"] == 1 and rec["per_process_batch"] == 64  # DP keeps the global batch in its process


def test_topology_invariance(tmp_path):
    """Same seed and global batch: the weights after the same steps agree at 1x1, 1x2 and 1x4."""
    weights = {}
    for shape in ("1x1", "1x2", "1x4"):
        out = tmp_path / shape
        out.mkdir()
        done = run(f"topology={shape}", *custom("workloads.invariance:main", out, "recipe.global_batch_size=32",
                                                  "+recipe.lr=0.01", "+recipe.epochs=3"), cwd=tmp_path / shape)
        assert done.code == 0, done.output
        weights[shape] = torch.load(out / "weights.pt")
    assert {w["steps"] for w in weights.values()} == {24}
    for shape in ("1x2", "1x4"):
        for name, ref in weights["1x1"]["state"].items():
            torch.testing.assert_close(weights[shape]["state"][name], ref, rtol=1e-4, atol=1e-5,
                                       msg=f"{name} differs at {shape}")


TORCHRUN_SCRIPT = '''
import argparse, json, os, sys, tempfile
import torch, torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--scale", type=float, default=1.0)
args = parser.parse_args()
dist.init_process_group(backend="gloo")  # env:// as under torchrun
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([args.scale * (rank + 1)])
dist.all_reduce(t)
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
        "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "OMP_NUM_THREADS", "TMPDIR"]
with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, "world": world, "sum": t.item(), "name": __name__, "argv0": sys.argv[0],
               "env": {k: os.environ.get(k) for k in keys}, "tempdir": tempfile.gettempdir()}, f)
dist.destroy_process_group()
'''


def test_script_recipe_runs_a_torchrun_style_script(tmp_path):
    script = tmp_path / "elsewhere" / "train.py"
    script.parent.mkdir()
    script.write_text(TORCHRUN_SCRIPT)
    art = tmp_path / "art"
    art.mkdir()
    done = run("recipe=script", f"recipe.path={script}", f"recipe.args=[--out,{art},--scale,2]", "topology=1x3",
               cwd=tmp_path)
    assert done.code == 0, done.output
    found = artifacts(art)
    assert sorted(found) == [0, 1, 2]
    for rank, rec in found.items():
        assert rec["world"] == 3 and rec["sum"] == 2 * 6 and rec["name"] == "__main__"
        assert rec["argv0"] == str(script)
        env = rec["env"]
        assert env["RANK"] == env["ROLE_RANK"] == str(rank) and env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "3"
        assert env["GROUP_RANK"] == "0" and env["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert env["TORCHELASTIC_RUN_ID"] == done.run_id and env["OMP_NUM_THREADS"]
        # the attempt's scratch folder, through the environment as any program would see it (removed after): short,
        # in the machine's temp folder (a Unix socket's path there fits: multiprocessing's, a DataLoader's workers')
        assert rec["tempdir"] == env["TMPDIR"] == str(RunPaths(run_folder(tmp_path), done.run_id).scratch(rank))
        assert len(env["TMPDIR"]) <= 40 and not env["TMPDIR"].startswith(str(tmp_path))
    assert not Path(env["TMPDIR"]).exists()


def test_failing_rank_stops_the_job(tmp_path):
    art = tmp_path / "art"
    art.mkdir()
    started = time.monotonic()
    done = run("topology=1x3", *custom("workloads.failing:main", art, "+recipe.fail_rank=1", "+recipe.fail_step=5",
                       "recipe.global_batch_size=3"),
               cwd=tmp_path)
    assert done.code == 1
    assert time.monotonic() - started < 60
    report = done.stderr[done.stderr.index("== job failed =="):done.stderr.index("\n== run ")]  # not the summary
    assert report.splitlines()[1].startswith("rank 1 ")  # the first failure, named, at the top
    assert "RuntimeError: injected failure on rank 1 at step 5" in report
    assert report.count("RuntimeError: injected failure") == 1  # shown once; the others' errors are summarised
    nothing_left(done.run_id)
    assert not (run_folder(tmp_path) / "tmp").exists()  # torch's error pickles went there, and are gone
    for pid_file in art.glob("pid*"):
        assert not psutil.pid_exists(int(pid_file.read_text())) or \
            psutil.Process(int(pid_file.read_text())).status() == "zombie"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_every_rank(tmp_path, sig):
    art = tmp_path / "art"
    art.mkdir()
    run_id = f"sig{sig.value}{tmp_path.name[-6:]}"
    with running("topology=1x2", "launcher.grace_s=2", *until_stopped(art), run_id=run_id, cwd=tmp_path) as proc:
        wait_for_pids(proc, art, 2)
        proc.send_signal(sig)
        done = proc.wait(30)
    assert done.code == 128 + sig.value, done.stderr
    nothing_left(run_id)


def test_killing_run_takes_its_processes_with_it(tmp_path):
    """SIGKILL cannot be handled: the launch agent and the ranks go because Linux kills them with
    their parent (PR_SET_PDEATHSIG), not because anyone cleans up; the ranks' scratch folders, which the agent
    could not remove, go at the next start of any `run` on the machine (runner.common.owned_folders)."""
    art = tmp_path / "art"
    art.mkdir()
    run_id = f"kill{tmp_path.name[-6:]}"
    with running("topology=1x2", "launcher.grace_s=2", *until_stopped(art), run_id=run_id, cwd=tmp_path) as proc:
        ranks = [psutil.Process(pid) for pid in wait_for_pids(proc, art, 2).values()]
        zygote = ranks[0].parent()  # ranks are forked by the host's zygote, which the launch agent started
        agent = zygote.parent()
        assert zygote.cmdline()[:3] == [sys.executable, "-u", "-c"] and agent.parent().pid == proc.pid
        assert f"run_id={run_id}" in ranks[0].cmdline()  # the zygote's command line ends with `run`'s: ps tells
        scratches = [RunPaths(run_folder(tmp_path), run_id).scratch(rank) for rank in (0, 1)]
        assert all(s.is_dir() for s in scratches), scratches
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    gone, alive = psutil.wait_procs([agent, zygote, *ranks], timeout=10)
    assert not alive, alive
    remove_abandoned()  # what the next `run` on this machine does first
    assert not any(s.exists() for s in scratches), scratches
    nothing_left(run_id)


def test_manual_launch_on_two_hosts_of_this_machine(tmp_path):
    art = tmp_path / "art"
    art.mkdir()
    hosts = "topology.hosts=[{name: 127.0.0.1, devices: 2}, {name: 127.0.0.2, devices: 1}]"
    common = ["launcher=manual", "topology=custom", hosts, "recipe.global_batch_size=48",
              *custom("workloads.artifact:main", art)]
    dry = run(*common, "dry_run=true", cwd=tmp_path)  # a run id (so a port) of its own
    assert dry.code == 0, dry.output
    launch = (run_folder(tmp_path) / "launch.txt").read_text()
    commands = [line.split(" && ", 1)[1] for line in launch.splitlines() if line.startswith("cd ")]
    assert len(commands) == 2
    with started(shlex.split(commands[1]), cwd=tmp_path, merged=True) as host1, \
            started(shlex.split(commands[0]), cwd=tmp_path, merged=True) as host0:
        results = finish([host1, host0])
    assert [code for code, _ in results] == [0, 0], results
    found = artifacts(art)
    assert sorted(found) == [0, 1, 2]
    assert [found[r]["env"]["GROUP_RANK"] for r in range(3)] == ["0", "0", "1"]
    assert [found[r]["local_rank"] for r in range(3)] == [0, 1, 0]
    assert all(rec["sum"] == 6.0 for rec in found.values())
    nothing_left(dry.run_id)  # the commands carry the dry run's id


README = Path(__file__).resolve().parents[2] / "README.md"
README_ACCURACY = re.compile(r"prints the final test accuracy\s+\((0\.\d+)–(0\.\d+);")


def test_default_job_trains_digits(tmp_path):
    done = run(cwd=tmp_path, timeout=300)
    assert done.code == 0, done.output
    acc = float(done.stdout.split("final test accuracy: ")[1].split()[0])
    low, high = README_ACCURACY.search(README.read_text()).groups()
    assert float(low) <= acc <= float(high), f"the README says {low}-{high}"
    folder = run_folder(tmp_path)
    for name in ("spec.yaml", "plan.json", "launch.txt", "metrics.jsonl", "checkpoints/last.pt",
                 "logs/rank00000.log", "logs/rank00001.log"):
        assert (folder / name).exists(), name
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["final"] is True and rows[-1]["test_accuracy"] == pytest.approx(acc, abs=1e-4)
    state = torch.load(folder / "checkpoints/last.pt")
    assert state["step"] == rows[-1]["step"]
