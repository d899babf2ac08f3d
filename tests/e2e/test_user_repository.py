"""A user's own repository, as a new user has it: a folder outside this checkout with its own package
(``mypkg``), its own ``recipes`` package (the bundled recipes' old top-level name), a ``runner.py`` that
would break any import of the runner it shadowed, a job folder with group options of its own, and a
script from the ``torch.distributed.launch`` days that requires ``--local_rank``. `run` is the installed
command, started in that folder with no PYTHONPATH, under every launcher: local, manual on two namespace
hosts, mpirun across them and Slurm on the test cluster, in both task modes."""

from __future__ import annotations

import json
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from runs import bed_hosts, mpi_options, nothing_left, on_each_host, run, user_env

pytestmark = pytest.mark.timeout(300)

FILES = {
    "mypkg/__init__.py": "",
    "mypkg/train.py": """
        import torch
        import torch.distributed as dist

        from recipes.report import write  # the user's own `recipes` package


        def main(ctx, cfg):
            t = torch.tensor([float(ctx.rank + 1)])
            dist.all_reduce(t)
            write(cfg.out_dir, ctx.rank, sum=t.item(), world=ctx.world_size, local_rank=ctx.local_rank,
                  lr=cfg.lr, kind="job")
    """,
    "recipes/__init__.py": "",
    "recipes/report.py": """
        import json
        import os
        import socket
        import sys
        from pathlib import Path

        import psutil


        def write(out_dir, rank, **facts):
            addrs = sorted(a.address for nics in psutil.net_if_addrs().values() for a in nics
                           if a.family == socket.AF_INET and not a.address.startswith("127."))
            runner = sys.modules.get("runner")
            facts.update(rank=rank, cwd=os.getcwd(), addrs=addrs, recipes=sys.modules["recipes"].__file__,
                         runner=getattr(runner, "__file__", None), pythonpath=os.environ.get("PYTHONPATH"),
                         node=os.environ.get("SLURMD_NODENAME"))
            Path(out_dir, f"rank{rank}.json").write_text(json.dumps(facts))
    """,
    "runner.py": """
        raise ImportError("the user's runner.py was imported in place of the runner")
    """,
    "jobs/mine.yaml": """
        # the user's job: the runner's `job`, with a recipe and a topology option of this folder's own
        defaults:
          - job
          - override recipe: mine
          - override topology: pair
          - _self_
        recipe:
          lr: 0.25
    """,
    "jobs/recipe/mine.yaml": """
        target: mypkg.train:main
        global_batch_size: 8
        seed: 0
        lr: 0.1
        out_dir: ???
    """,
    "jobs/topology/pair.yaml": """
        nodes: 1
        devices_per_node: 2
    """,
    "legacy_launch.py": """
        # written for `python -m torch.distributed.launch --nproc_per_node=N legacy_launch.py --out DIR`
        import argparse
        import datetime

        import torch
        import torch.distributed as dist

        from recipes.report import write

        parser = argparse.ArgumentParser()
        parser.add_argument("--local_rank", type=int, required=True)
        parser.add_argument("--out", required=True)
        args = parser.parse_args()
        dist.init_process_group(backend="gloo", init_method="env://")
        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        timeout = dist.distributed_c10d._get_default_timeout(dist.Backend.GLOO)  # what the group got
        write(args.out, dist.get_rank(), sum=t.item(), world=dist.get_world_size(), local_rank=args.local_rank,
              kind="legacy", timeout_s=timeout.total_seconds())
        dist.destroy_process_group()
    """,
}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """The user's repository, in a temporary folder outside the checkout."""
    root = tmp_path / "user-repo"
    for name, text in FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    (root / "out").mkdir()
    return root


def job(repo: Path, *extra: str) -> list[str]:
    return ["--config-dir", str(repo / "jobs"), "--config-name", "mine", f"recipe.out_dir={repo / 'out'}",
            "init.timeout_s=60", *extra]


def legacy(repo: Path, *overrides: str) -> list[str]:
    """torchrun's shape: overrides, `--`, the script and its arguments (no quoting)."""
    return [*overrides, "recipe.local_rank_arg=--local_rank", "init.timeout_s=60", "--", *script(repo)]


def script(repo: Path) -> tuple[str, ...]:
    return ("legacy_launch.py", "--out", str(repo / "out"))


def found(repo: Path, kind: str, world: int, per_host: list[int] | None = None, testbed=None) -> dict[int, dict]:
    """Every rank wrote its record: the all-reduce summed 1..world, each ran in the user's folder with the
    runner's own package (not the user's runner.py) and the user's own `recipes`, and no PYTHONPATH."""
    records = {int(p.stem[4:]): json.loads(p.read_text()) for p in (repo / "out").glob("rank*.json")}
    assert sorted(records) == list(range(world)), records
    for rank, rec in records.items():
        assert rec["kind"] == kind and rec["sum"] == world * (world + 1) / 2 and rec["world"] == world, rec
        assert rec["cwd"] == str(repo), rec
        assert rec["recipes"] == str(repo / "recipes" / "__init__.py"), rec
        assert rec["runner"] and not rec["runner"].startswith(str(repo)), rec
        assert rec["pythonpath"] is None, rec
    if per_host and testbed is not None:  # the ranks ran on the bed's hosts in plan order
        rank = 0
        for host, n in zip(testbed.hosts, per_host):
            for local in range(n):
                assert host.addr in records[rank]["addrs"] and records[rank]["local_rank"] == local, records[rank]
                rank += 1
    return records


def test_a_users_own_package_job_folder_and_recipes_run_locally(repo):
    done = run(*job(repo), cwd=repo, workloads=False)
    assert done.code == 0, done.output
    records = found(repo, "job", 2)
    assert {r["lr"] for r in records.values()} == {0.25}  # the job file's value over its recipe option's
    spec = next(repo.glob("outputs/*/*/spec.yaml")).read_text()
    assert f"workdir: {repo}\n" in spec and "target: mypkg.train:main" in spec


def test_the_bundled_recipes_work_beside_a_users_recipes_package(repo):
    done = run("recipe.epochs=1", cwd=repo, workloads=False)
    assert done.code == 0, done.output
    assert "final test accuracy" in done.output and "runner.recipes.digits:main" in done.output


def test_a_legacy_script_that_requires_local_rank_gets_it(repo):
    done = run(*legacy(repo, "topology=1x2"), cwd=repo, workloads=False)
    assert done.code == 0, done.output
    records = found(repo, "legacy", 2)
    assert [records[r]["local_rank"] for r in (0, 1)] == [0, 1]
    assert {r["timeout_s"] for r in records.values()} == {60.0}  # init.timeout_s, not torch's 30 minutes
    spec = next(repo.glob("outputs/*/*/spec.yaml")).read_text()
    assert "path: legacy_launch.py" in spec and f"  - --out\n  - {repo / 'out'}\n" in spec
    assert "local_rank_arg: --local_rank" in spec


def test_without_local_rank_arg_the_legacy_script_says_what_argparse_said(repo):
    done = run("topology=1x2", "--", "legacy_launch.py", "--out", str(repo / "out"), cwd=repo, workloads=False)
    assert done.code == 1, done.output
    assert "the following arguments are required: --local_rank" in done.output
    assert "hint: recipe.local_rank_arg=--local_rank passes it" in done.output


def test_a_target_that_would_not_import_in_the_ranks_is_refused_before_launch(repo):
    (repo / "mypkg" / "broken.py").write_text("import torch\nimport no_such_dependency_x\n\ndef main(ctx, cfg):\n    pass\n")
    (repo / "mypkg" / "reexport.py").write_text("from mypkg.train import *  # noqa\n")
    (repo / "nsp").mkdir()  # a namespace package: no __init__.py, no functions
    cases = {
        "mypkg.broken:main": "importing 'mypkg.broken' raised ModuleNotFoundError: No module named 'no_such_dependency_x' "
                             f"at {repo / 'mypkg' / 'broken.py'}:2",
        "mypkg.reexport:nope": "module 'mypkg.reexport'",
        "nsp:main": "module 'nsp' (a namespace package) defines no 'main'",
        "mypkg.train:write": None,  # imported into the module: a function it has
    }
    for target, says in cases.items():
        done = run("recipe=custom", f"recipe.target={target}", "+recipe.out_dir=x", "+recipe.lr=1", "dry_run=true",
                   cwd=repo, workloads=False)
        if says is None:
            assert done.code == 0, done.output
            continue
        assert done.code == 2, (target, done.output)
        assert says in done.stderr and "nothing was started" in done.stderr, (target, done.stderr)
        assert "Traceback" not in done.output


def test_manual_on_two_namespace_hosts(testbed, repo):
    run_id = f"u{uuid.uuid4().hex[:8]}"
    args = job(repo, *bed_hosts(testbed, [2, 1]), "launcher=manual", "recipe.global_batch_size=6")
    results = on_each_host(testbed, repo, args, run_id, workloads=False)
    assert [code for code, _ in results] == [0, 0], results
    found(repo, "job", 3, [2, 1], testbed)
    nothing_left(run_id)

    for f in (repo / "out").iterdir():
        f.unlink()
    run_id = f"u{uuid.uuid4().hex[:8]}"
    overrides = [*bed_hosts(testbed, [1, 2]), "launcher=manual", "recipe.local_rank_arg=--local_rank"]
    results = on_each_host(testbed, repo, overrides, run_id, script=script(repo), workloads=False)
    assert [code for code, _ in results] == [0, 0], results
    records = found(repo, "legacy", 3, [1, 2], testbed)
    assert [records[r]["local_rank"] for r in (0, 1, 2)] == [0, 0, 1]
    nothing_left(run_id)


@pytest.mark.parametrize("tasks", ["per_host", "per_device"])
def test_mpirun_across_namespace_hosts(testbed, repo, tasks):
    common = [*bed_hosts(testbed, [2, 1]), *mpi_options(testbed), f"launcher.tasks={tasks}"]
    done = run(*job(repo, *common, "recipe.global_batch_size=6"), cwd=repo, env=testbed.env(), workloads=False)
    assert done.code == 0, done.output
    found(repo, "job", 3, [2, 1], testbed)
    for f in (repo / "out").iterdir():
        f.unlink()
    done = run(*legacy(repo, *common), cwd=repo, env=testbed.env(), workloads=False)
    assert done.code == 0, done.output
    records = found(repo, "legacy", 3, [2, 1], testbed)
    assert [records[r]["local_rank"] for r in (0, 1, 2)] == [0, 1, 0]


@pytest.mark.parametrize("tasks", ["per_host", "per_device"])
def test_slurm_on_the_test_cluster(testbed, repo, tasks):
    common = ["topology=2x2", "launcher=slurm", f"launcher.tasks={tasks}",
              f"launcher.slurm.partition={testbed.partition}"]
    done = run(*job(repo, *common, "recipe.global_batch_size=8"), cwd=repo, env=testbed.env(), workloads=False)
    assert done.code == 0, done.output
    records = found(repo, "job", 4)
    assert {r["node"] for r in records.values()} == set(testbed.names)
    for f in (repo / "out").iterdir():
        f.unlink()
    done = run(*legacy(repo, *common), cwd=repo, env=testbed.env(), workloads=False)
    assert done.code == 0, done.output
    records = found(repo, "legacy", 4)
    assert sorted(r["local_rank"] for r in records.values()) == [0, 0, 1, 1]
    assert "-P -m runner.app.task" in next(repo.glob("outputs/*/*/job.sbatch")).read_text()


def test_the_task_command_is_not_shadowed_by_a_users_runner_py(repo):
    """What srun and mpirun run, in the user's folder: `python -P -m runner.app.task` imports the runner;
    `python -m runner.app.task` would import the user's runner.py and fail."""
    import subprocess

    shadowed = subprocess.run([sys.executable, "-m", "runner.app.task"], cwd=repo, env=user_env(), capture_output=True,
                              text=True, timeout=60)
    assert "the user's runner.py was imported" in shadowed.stderr
    ours = subprocess.run([sys.executable, "-P", "-m", "runner.app.task"], cwd=repo, env=user_env(),
                          capture_output=True, text=True, timeout=60)
    assert ours.returncode == 2 and "usage: python -P -m runner.app.task" in ours.stderr, ours.stderr
