"""docs/recipes.md, "Moving an existing launch to a job file": every job file of examples/migrate/jobs run as the page
says, from a copy of examples/migrate (a user's folder outside the checkout, no PYTHONPATH), with the bed's
host names in place of node-a and node-b. Each example script writes artifacts/rank<r>.json once trained."""

from __future__ import annotations

import json
import re
import shutil
import uuid
from pathlib import Path

import pytest

from conftest import REPO
from readme_text import docs
from runs import mpi_options, nothing_left, on_each_host, run

pytestmark = pytest.mark.timeout(300)

EXAMPLES = REPO / "examples" / "migrate"
# job file -> (script, world size, processes per host)
JOBS = {
    "torchrun": ("train_torchrun", 4, [4]),
    "launch": ("train_launch", 4, [2, 2]),
    "imagenet": ("imagenet_style", 4, [2, 2]),
    "espnet": ("espnet_style", 4, [2, 2]),
    "mpirun": ("mpi_style", 4, [2, 2]),
    "spawn-8-2": ("spawn_gpus", 10, [8, 2]),
}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "migrate"
    shutil.copytree(EXAMPLES, root, ignore=shutil.ignore_patterns("__pycache__", "artifacts", "outputs"))
    return root


def job(name: str, *extra: str) -> list[str]:
    return ["--config-dir", "jobs", "--config-name", name, *extra]


def bed_names(testbed) -> list[str]:
    return [f"topology.hosts.{i}.name={h.name}" for i, h in enumerate(testbed.hosts)]


def trained(folder: Path, name: str, testbed=None) -> dict[int, dict]:
    """Every rank of the job trained the same model (DDP kept the weights equal) and all-reduced over the
    whole world; with a bed, each host ran its share of ranks, in plan order."""
    script, world, per_host = JOBS[name]
    found = {int(p.stem[4:]): json.loads(p.read_text()) for p in (folder / "artifacts").glob("rank*.json")}
    assert sorted(found) == list(range(world)), found
    assert {r["script"] for r in found.values()} == {script}
    assert {r["sum"] for r in found.values()} == {world * (world + 1) / 2}
    assert len({tuple(r["weight"]) for r in found.values()}) == 1
    rank = 0
    for n in per_host:
        assert [found[rank + i]["local_rank"] for i in range(n)] == list(range(n))
        rank += n
    return found


def test_every_job_file_is_in_the_readme_and_tested() -> None:
    files = sorted(p.stem for p in (EXAMPLES / "jobs").glob("*.yaml"))
    assert files == sorted(JOBS)
    section = docs().section("Moving an existing launch to a job file")
    assert sorted(set(re.findall(r"--config-name ([\w-]+)", section))) == sorted(JOBS)


def test_torchrun(folder) -> None:
    done = run(*job("torchrun"), cwd=folder, workloads=False)
    assert done.code == 0, done.output
    assert {r["epochs"] for r in trained(folder, "torchrun").values()} == {3}
    shutil.rmtree(folder / "artifacts")
    same = run("topology=1x4", "--", "train_torchrun.py", "--epochs", "3", cwd=folder, workloads=False)
    assert same.code == 0, same.output
    trained(folder, "torchrun")


@pytest.mark.parametrize("name", ["launch", "imagenet", "spawn-8-2"])
def test_by_hand_on_each_host(testbed, folder, name) -> None:
    run_id = f"mig{uuid.uuid4().hex[:8]}"
    results = on_each_host(testbed, folder, job(name, *bed_names(testbed)), run_id, timeout=240, workloads=False)
    assert [code for code, _ in results] == [0, 0], results
    found = trained(folder, name, testbed)
    if name == "launch":
        assert {r["lr"] for r in found.values()} == {0.1}
    if name == "imagenet":
        assert {r["dist_url"] for r in found.values()} == {"env://"}
    nothing_left(run_id)


def test_espnet_on_slurm(testbed, folder) -> None:
    done = run(*job("espnet", f"launcher.slurm.partition={testbed.partition}"), cwd=folder, env=testbed.env(),
               workloads=False)
    assert done.code == 0, done.output
    trained(folder, "espnet")


def test_mpirun(testbed, folder) -> None:
    done = run(*job("mpirun", *bed_names(testbed), *mpi_options(testbed)), cwd=folder, env=testbed.env(),
               workloads=False)
    assert done.code == 0, done.output
    trained(folder, "mpirun", testbed)
