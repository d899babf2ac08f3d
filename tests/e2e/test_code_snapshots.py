"""The code a run ran, kept and recorded: provenance.json and the summary's code line for a dirty working tree;
launcher.snapshot_code, so that an attempt started after the code was edited (a restart here, a requeue on the
Slurm cluster) still runs the code that was submitted, and without it the edited code."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest

from runs import run, run_folder, running, stage_workloads, wait_until

pytestmark = pytest.mark.timeout(300)


def git(folder: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(folder), "-c", "user.email=t@t", "-c", "user.name=t", *args], check=True,
                          capture_output=True, text=True).stdout


def user_repository(tmp_path: Path) -> Path:
    """A user's repository holding the tests' workloads, committed."""
    repo = tmp_path / "repo"
    stage_workloads(repo)
    (repo / ".gitignore").write_text("outputs/\n__pycache__/\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "the user's code")
    return repo


def versioned(out: Path, *extra: str) -> list[str]:
    return ["recipe=custom", "recipe.target=workloads.versioned:main", f"+recipe.out_dir={out}", *extra]


@pytest.mark.parametrize("snapshot", [True, False])
def test_a_restart_runs_the_launched_code_only_from_a_snapshot(tmp_path, snapshot):
    repo, out = user_repository(tmp_path), tmp_path / "out"
    out.mkdir()
    done = run("topology=1x2", "launcher.max_restarts=1", f"launcher.snapshot_code={str(snapshot).lower()}",
               *versioned(out, "+recipe.edit=true"), cwd=repo)
    assert done.code == 0, done.output
    assert "VERSION = 2" in (repo / "workloads" / "versioned.py").read_text()  # edited during the first attempt
    ran = {k: (out / f"ran{k}").read_text() for k in (0, 1)}
    folder = run_folder(repo)
    record = json.loads((folder / "provenance.json").read_text())
    if snapshot:
        assert ran == {0: "1", 1: "1"}  # the restart ran the code as it was launched
        assert record["code_snapshot"] == str(folder / "code")
        assert "VERSION = 1" in (folder / "code" / "workloads" / "versioned.py").read_text()
        assert "ran from its copy in code/" in done.stdout + done.stderr
    else:
        assert ran == {0: "1", 1: "2"}  # the restart imported the folder's code as it was by then
        assert record["code_snapshot"] is None and not (folder / "code").exists()


def test_provenance_of_a_dirty_tree(tmp_path):
    repo, out = user_repository(tmp_path), tmp_path / "out"
    out.mkdir()
    commit = git(repo, "rev-parse", "HEAD").strip()
    with open(repo / "workloads" / "versioned.py", "a") as f:
        f.write("# tried something\n")
    done = run("topology=1x2", *versioned(out), cwd=repo)
    assert done.code == 0, done.output
    summary = done.stdout + done.stderr
    assert f"code      git {commit[:12]} (main), dirty: 1 tracked file(s) changed (the diff: provenance.json)" in summary
    record = json.loads((run_folder(repo) / "provenance.json").read_text())
    assert record["git"]["commit"] == commit and record["git"]["dirty"]
    assert "+# tried something" in record["git"]["diff"]
    assert record["command"][1:] == ["topology=1x2", *versioned(out), f"run_id={done.run_id}"]
    assert record["hosts"] == ["node0"] and record["workdir"] == str(repo)
    assert any(p.startswith("torch==") for p in record["packages"])
    assert record["runtime"]["torch"] == record["build"]["torch"] and record["runtime"]["device"] == "cpu"


@pytest.mark.parametrize("snapshot", ["default", "false"])
def test_a_requeued_slurm_job_runs_the_submitted_code(testbed, tmp_path, snapshot):
    """Submitted from a git repository, a batch job runs from its snapshot (on by default for Slurm batch jobs):
    the recipe edited after the submission and the job requeued with scontrol, the second attempt still runs the
    submitted version; with launcher.snapshot_code=false, the edited one."""
    repo, out = user_repository(tmp_path), tmp_path / "out"
    out.mkdir()
    run_id = f"sq{uuid.uuid4().hex[:8]}"
    chosen = [] if snapshot == "default" else [f"launcher.snapshot_code={snapshot}"]
    with running("topology=2x1", "launcher=slurm", "launcher.slurm.requeue=true", *chosen,
                 *versioned(out, "+recipe.hold=120"), run_id=run_id, cwd=repo, env=testbed.env(), merged=True) as proc:
        wait_until((out / "ran0").exists, 120, "the first attempt ran", alive=[proc])
        source = repo / "workloads" / "versioned.py"
        source.write_text(source.read_text().replace("VERSION = 1", "VERSION = 2"))
        job_id = (run_folder(repo) / "slurm_job_id").read_text().strip()
        subprocess.run(["scontrol", "requeue", job_id], env=testbed.env(), check=True, capture_output=True)
        done = proc.wait(240)
    output = done.output
    assert done.code == 0, output
    folder = run_folder(repo)
    copy = json.loads((folder / "provenance.json").read_text())["code_snapshot"]
    if snapshot == "default":
        assert (out / "ran0").read_text() == "1" and (out / "ran1").read_text() == "1", output
        assert copy == str(folder / "code") and "ran from its copy in code/" in output
    else:
        assert (out / "ran0").read_text() == "1" and (out / "ran1").read_text() == "2", output
        assert copy is None and "ran from its copy" not in output
