"""runner.launchers.slurm.sbatch: the batch script is a request (SbatchRequest), made from the plan once; its text is
what its materialize() gives, which the dry run prints as it is (every case: tests/golden/slurm_*.txt), and which
runs under bash as it says (srun and scontrol faked below; the real cluster: test_slurm_cluster.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import environment, validate
from runner.launchers import Invocation, plan_for
from runner.launchers.slurm.job import mark_user_stop
from runner.launchers.slurm.launcher import SlurmLauncher
from runner.records.paths import RunPaths
from runs import wait_until

pytestmark = pytest.mark.unit


def _launcher(folder: Path, *overrides: str) -> SlurmLauncher:
    checked = validate(["launcher=slurm", "device=cpu", *overrides])
    assert checked.job is not None, checked.problems
    paths = RunPaths(folder, "R1")
    return SlurmLauncher(plan=plan_for(checked.job, paths), paths=paths,
                         invocation=Invocation(python="/venv/bin/python", cwd="/work/proj"), environment=environment())


def test_the_dry_run_prints_what_the_request_materializes():
    launcher = _launcher(Path("/runs/R1"), "topology=2x2", "launcher.slurm.requeue=true")
    request = launcher.sbatch()
    assert launcher.request().files == {"job.sbatch": request.materialize()}
    assert launcher.request().materialize().endswith(f"# --- job.sbatch ---\n{request.materialize()}")
    assert request == launcher.sbatch()  # a value: made again, the same


def test_the_script_says_what_its_request_holds():
    request = _launcher(Path("/runs/R1"), "topology=2x2").sbatch()
    assert (request.nodes, request.tasks_per_node, request.cpus_per_task, request.gpus) == (2, 1, 2, None)
    asked = dataclasses.replace(request, gpus="gres=gpu:4", options=(("partition", "gpu a"),), extra=("--exclusive",),
                                requeue=True, stop_signal=signal.SIGUSR2)
    directives = asked.directives()
    assert directives[-4:] == ["#SBATCH --gres=gpu:4", "#SBATCH --cpus-per-task=2", "#SBATCH --partition='gpu a'",
                               "#SBATCH --exclusive"]
    assert "#SBATCH --requeue" in directives
    text = asked.materialize()
    assert [line for line in text.splitlines() if line.startswith("#SBATCH ")] == directives
    assert "kill -USR2 \"$step\" 2>/dev/null' USR2" in text and 'scontrol requeue "$SLURM_JOB_ID"' in text
    assert text.endswith('exit "$status"\n')
    assert "scontrol requeue" not in request.materialize()


FAKE_SRUN = """#!/bin/bash
# srun as the batch script sees it: runs until SIGUSR1 (the ranks checkpoint and return), then exits 0
trap 'kill "$pid"; exit 0' USR1
sleep 600 & pid=$!
touch "$FAKES/srun.started"
wait "$pid"
"""
FAKE_SCONTROL = '#!/bin/bash\necho "$@" >> "$FAKES/scontrol.calls"\n'


@pytest.mark.parametrize("asked_of_run", [False, True])
def test_with_requeue_the_batch_script_requeues_after_slurms_signal_but_not_after_a_stop_asked_of_run(
        tmp_path, asked_of_run):
    """The generated batch script itself, under bash, with srun and scontrol faked: the stop signal to it (as
    `scancel --signal=USR1 --batch` delivers it) reaches the step; the script then requeues the job, unless `run`
    wrote the user-stop marker first; either way it exits with the step's status."""
    fakes, folder = tmp_path / "bin", tmp_path / "run"
    fakes.mkdir(), folder.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (fakes / name).write_text(text)
        (fakes / name).chmod(0o755)
    launcher = _launcher(folder, "topology=2x2", "launcher.slurm.requeue=true")
    paths = launcher.paths
    script = folder / "job.sbatch"
    script.write_text(launcher.sbatch().materialize())
    env = {"PATH": f"{fakes}:/usr/bin:/bin", "FAKES": str(fakes), "SLURM_JOB_ID": "42"}
    batch = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)  # its group: the fake step goes with it, whatever happens
    try:
        wait_until(lambda: (fakes / "srun.started").exists(), 30, "the step started", alive=[batch])
        if asked_of_run:
            mark_user_stop([paths.user_stop], signal.SIGUSR1)
        batch.send_signal(signal.SIGUSR1)
        out, _ = batch.communicate(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(batch.pid, signal.SIGKILL)
        batch.wait()
    assert batch.returncode == 0, out
    assert "run: SIGUSR1 from Slurm: asking the ranks to checkpoint and stop" in out
    requeued = (fakes / "scontrol.calls").read_text() if (fakes / "scontrol.calls").exists() else ""
    if asked_of_run:
        assert requeued == "" and "run: stopped at the user's request (user_stop): job 42 ends, not requeued" in out
    else:
        assert requeued == "requeue 42\n" and "run: requeueing job 42" in out
