"""runner.app.sweep_launchers: `run -m` under Hydra's submitit launcher is refused before anything is submitted
(on the Slurm test cluster: no job, no submitit folder), with the reason and the runner's own Slurm sweep as the
hint, whether chosen on the command line or in a job file; Hydra's basic launcher runs a sweep as ours does."""

from __future__ import annotations

import subprocess
import uuid

import pytest

from runs import run
from runner.app.sweep_launchers import basic_launcher_target, launcher_problem
from runner.app.sweep_launchers import LAUNCHER
from runner.spec.problems import Severity

SUBMITIT = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"


@pytest.mark.unit
def test_which_launchers_can_run_a_sweep() -> None:
    assert (basic_launcher_target() or "").endswith(".BasicLauncher")  # as Hydra registers hydra/launcher=basic
    assert launcher_problem(LAUNCHER, "runner") is None and launcher_problem(basic_launcher_target(), "basic") is None
    refused = launcher_problem(SUBMITIT, "submitit_slurm")
    assert refused.severity is Severity.error and refused.key == "hydra/launcher=submitit_slurm"
    assert "waiting forever" in refused.message and "run -m ... launcher=slurm" in refused.hint
    untried = launcher_problem("hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher", "joblib")
    assert untried.severity is Severity.warning


def _refused(done, tmp_path) -> None:
    assert done.code == 2, done.output
    assert "error: hydra/launcher=submitit_slurm: Hydra's submitit launcher cannot run `run`'s jobs soundly" in done.stderr
    assert "hint: run -m ... launcher=slurm sends the sweep's jobs to Slurm as job arrays" in done.stderr
    assert "nothing was started." in done.stderr and "Traceback" not in done.output
    assert not (tmp_path / "submitit").exists() and not (tmp_path / "outputs").exists()


def test_the_submitit_launcher_is_refused_before_it_submits(testbed, tmp_path):
    name = f"sub{uuid.uuid4().hex[:8]}"
    done = run("-m", "hydra/launcher=submitit_slurm", "topology=1x1,1x2", f"hydra.launcher.name={name}",
               f"hydra.launcher.submitit_folder={tmp_path / 'submitit'}", cwd=tmp_path, env=testbed.env())
    _refused(done, tmp_path)
    queued = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], env=testbed.env(), capture_output=True,
                            text=True, check=True).stdout.split()
    assert not queued, queued


def test_a_job_file_that_picks_it_is_refused_too(testbed, tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "sweep.yaml").write_text("defaults:\n  - job\n  - override hydra/launcher: submitit_slurm\n  - _self_\n"
                                     f"hydra:\n  launcher:\n    submitit_folder: {tmp_path / 'submitit'}\n")
    done = run("--config-dir", str(jobs), "--config-name", "sweep", "-m", "topology=1x1,1x2", cwd=tmp_path,
               env=testbed.env())
    _refused(done, tmp_path)


def test_hydras_basic_launcher_runs_a_sweep(tmp_path):
    done = run("-m", "hydra/launcher=basic", "topology=1x1,1x2", "recipe.epochs=1", cwd=tmp_path)
    assert done.code == 0, done.output
    assert "== sweep: 2 job(s) ==" in done.stdout and "warning" not in done.stderr
