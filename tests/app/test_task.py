"""`python -m runner.app.task SPEC`: the task a scheduler starts, run here with the variables srun or
mpirun would set (the real Slurm cluster and mpirun come with their own tests)."""

from __future__ import annotations

import os
import socket
import sys
from contextlib import ExitStack

import pytest

from runs import artifacts, Finished, nothing_left, run, run_folder, started, user_env

pytestmark = pytest.mark.timeout(180)


def _dry_run(tmp_path, *overrides: str):
    art = tmp_path / "art"
    art.mkdir()
    done = run(*overrides, "recipe=custom", "recipe.target=workloads.artifact:main", f"+recipe.out_dir={art}",
               "dry_run=true", cwd=tmp_path)
    assert done.code == 0, done.output
    return run_folder(tmp_path) / "spec.yaml", art, done.run_id


def _start_tasks(spec, variables: list[dict[str, str]]) -> list[Finished]:
    """The tasks, started as the launch starts them (``-P``: the folder they start in is not on their path)
    in the run's folder (the spec's workdir, where the workloads are, is found from the spec)."""
    with ExitStack() as stack:
        tasks = [stack.enter_context(started([sys.executable, "-P", "-m", "runner.app.task", str(spec)],
                                             cwd=spec.parent, env=user_env(v))) for v in variables]
        return [task.wait(120) for task in tasks]


def _ompi(rank: int, size: int, local: int, local_size: int) -> dict[str, str]:
    return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(size),
            "OMPI_COMM_WORLD_LOCAL_RANK": str(local), "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size)}


def test_mpi_tasks_one_per_process(tmp_path):
    spec, art, run_id = _dry_run(tmp_path, "topology=1x3", "launcher=mpi", "recipe.global_batch_size=3")
    results = _start_tasks(spec, [_ompi(r, 3, r, 3) for r in range(3)])
    assert [r.code for r in results] == [0, 0, 0], [r.stderr for r in results]
    found = artifacts(art)
    assert sorted(found) == [0, 1, 2] and {rec["sum"] for rec in found.values()} == {6.0}
    assert {rec["env"]["TORCHELASTIC_RUN_ID"] for rec in found.values()} == {run_id}
    nothing_left(run_id)


def test_mpi_tasks_one_per_host_fork_their_devices(tmp_path):
    hosts = "topology.hosts=[{name: 127.0.0.1, devices: 2}, {name: 127.0.0.2, devices: 1}]"
    spec, art, run_id = _dry_run(tmp_path, "topology=custom", hosts, "launcher=mpi", "launcher.tasks=per_host",
                                 "recipe.global_batch_size=3")
    results = _start_tasks(spec, [_ompi(0, 2, 0, 1), _ompi(1, 2, 0, 1)])
    assert [r.code for r in results] == [0, 0], [r.stderr for r in results]
    found = artifacts(art)
    assert sorted(found) == [0, 1, 2]
    assert [found[r]["env"]["GROUP_RANK"] for r in range(3)] == ["0", "0", "1"]
    assert {rec["sum"] for rec in found.values()} == {6.0}
    nothing_left(run_id)


def test_slurm_tasks_one_per_process(tmp_path):
    # the port is derived from the job id (20000 + id % 10000): pick an id whose port is free here
    with socket.socket() as s:
        for port in range(20000 + os.getpid() % 5000, 30000):
            try:
                s.bind(("127.0.0.1", port))
                break
            except OSError:
                continue
    job_id = str(port - 20000)
    spec, art, run_id = _dry_run(tmp_path, "topology=1x2", "launcher=slurm", "launcher.tasks=per_device", "device=cpu")
    slurm = [{"SLURM_JOB_ID": job_id, "SLURM_STEP_ID": "0", "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r),
              "SLURM_NODEID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_NODELIST": "localhost"} for r in range(2)]
    results = _start_tasks(spec, slurm)
    assert [r.code for r in results] == [0, 0], [r.stderr for r in results]
    found = artifacts(art)
    assert sorted(found) == [0, 1] and {rec["env"]["MASTER_PORT"] for rec in found.values()} == {str(port)}


def test_a_place_that_contradicts_the_plan_is_refused(tmp_path):
    spec, art, _ = _dry_run(tmp_path, "topology=1x3", "launcher=mpi", "recipe.global_batch_size=3")
    results = _start_tasks(spec, [_ompi(r, 2, r, 2) for r in range(2)])
    assert [r.code for r in results] == [2, 2]
    assert "Open MPI started 2 task(s), but the spec needs 3" in results[0].stderr
    assert "Traceback" not in results[0].stderr
    assert not artifacts(art)


def test_a_task_outside_any_scheduler_says_so(tmp_path):
    spec, _, _ = _dry_run(tmp_path, "topology=1x2", "launcher=mpi")
    (result,) = _start_tasks(spec, [{}])
    assert result.code == 2 and "no MPI rank variables are set" in result.stderr


# --------------------------------------------------------------------------- a round of a Slurm job that outlives nodes

@pytest.mark.unit
def test_a_task_takes_its_spec_and_a_round() -> None:
    from pathlib import Path

    from runner.app.task import SchedulerTask

    assert SchedulerTask.of(["s.yaml"]) == SchedulerTask(Path("s.yaml").resolve(), None)
    assert SchedulerTask.of(["s.yaml", "--round", "3"]) == SchedulerTask(Path("s.yaml").resolve(), 3)
    assert SchedulerTask.of(["s.yaml", "--round"]) is None and SchedulerTask.of(["s.yaml", "--round", "x"]) is None
    # a round's task restarts its share in place (launcher.max_restarts); a plain task never does
    assert [SchedulerTask(Path("s.yaml"), r).restarts_itself for r in (None, 0)] == [False, True]


@pytest.mark.parametrize("beat, said", [
    ("1 4\n", "the job is at attempt 2 (this task ran attempt 1): stopping this node's share"),
    ("0 4\n", "no beat from the `run` that holds the job's rounds for 8 s"),
])
def test_a_rounds_task_stops_its_share_once_the_holder_moved_on_or_fell_silent(tmp_path, beat, said):
    """runner.app.task.RoundWatch: what the holder wrote in the run folder (runner.launchers.slurm.rounds) says the
    round is over, or it stopped writing: the task stops its share as on SIGTERM (here: nothing handles it)."""
    (tmp_path / "rounds.beat").write_text(beat)
    code = ("import time; from pathlib import Path; from runner.app.task import RoundWatch; "
            "from runner.app.host_entry import HolderGone; from runner.records.paths import RunPaths; "
            f"RoundWatch(RunPaths(Path({str(tmp_path)!r}), 'r'), 0, 1, 1, HolderGone(30)).start(); time.sleep(60)")
    with started([sys.executable, "-c", code], cwd=tmp_path, merged=True) as proc:
        done = proc.wait(30)
    assert done.code == -15 and said in done.output, done
    assert done.output.count("\x1erunner-report ") >= 1 and '"host": 1' in done.output  # it said Alive meanwhile
