"""Sweeps on Slurm (`run -m ... launcher=slurm`): one job array per resource shape, followed to the end.

The grouping, task-id parsing and the array script are checked on their own; then real sweeps on the
two-node test cluster (scripts/testbed.py): every job done with its own folder and output, a failing job
that does not stop the others, and follow=false leaving the arrays to Slurm."""

from __future__ import annotations

import csv
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from runner.launchers.slurm.array import ArrayFollower, ArrayMember, group
from runner.launchers.slurm.job import SlurmStates, ask_to_stop, task_ids
from runner.records.paths import RunPaths
from runs import processes_of, run, signal_when_ready, wait_until
from slurm_fakes import Clock, Slurm, ok

pytestmark = pytest.mark.timeout(300)

# The signal tests' jobs (tests/workloads/elastic.py): a step every 0.1 s, a checkpoint and a look for a stop request
# every EVERY steps, until the signal (a training that burns the CPU while a test waits costs every other test)
EVERY = 5
SAVED = "outputs/multirun/*/*/*/checkpoints/last.pt"  # a job's first checkpoint: it is training


def _paced(tmp_path: Path) -> list[str]:
    out = tmp_path / "steps"
    out.mkdir(exist_ok=True)
    return ["recipe=custom", "recipe.target=workloads.elastic:main", f"+recipe.out_dir={out}", "+recipe.steps=100000",
            f"+recipe.every={EVERY}", "+recipe.step_s=0.1", "recipe.global_batch_size=2"]


def _member(folder: Path, directives: tuple[str, ...], parallelism: int | None = None) -> ArrayMember:
    return ArrayMember(paths=RunPaths(folder, folder.name), ranks=(0,), directives=directives, cwd="/work",
                       parallelism=parallelism)


def test_task_ids_read_slurms_forms():
    assert task_ids("3") == (3,)
    assert task_ids("1-3") == (1, 2, 3)
    assert task_ids("0,2-4%2") == (0, 2, 3, 4)  # tasks pending together, throttled (scontrol)
    assert task_ids("[0,2-4%2]") == (0, 2, 3, 4)  # the same in sacct's JobID
    assert task_ids("N/A") == ()


def test_jobs_that_ask_for_the_same_resources_share_an_array(tmp_path):
    small, big = ("#SBATCH --nodes=1", "#SBATCH --cpus-per-task=2"), ("#SBATCH --nodes=2", "#SBATCH --cpus-per-task=2")
    members = {n: _member(tmp_path / str(n), d) for n, d in [(0, small), (1, big), (2, small), (3, big), (4, small)]}
    arrays = group(members)
    assert [list(a.members) for a in arrays] == [[0, 2, 4], [1, 3]]
    assert [a.directives for a in arrays] == [small, big]


@pytest.mark.unit
def test_a_sweeps_arrays_are_asked_about_less_often_while_their_tasks_stay_as_they_are(tmp_path):
    slurm = Slurm(Clock())

    def sacct() -> subprocess.CompletedProcess:  # task 0 ends at 100 s, task 1 at 400 s
        now = slurm.clock.now
        return ok("".join(f"90_{n}|{'COMPLETED' if now >= end else 'RUNNING'}|0:0|node1|None\n"
                          for n, end in ((0, 100), (1, 400))))

    slurm.answers["sacct"] = sacct
    (array,) = group({n: _member(tmp_path / str(n), ()) for n in (0, 1)})
    follower = ArrayFollower([("90", array)], tmp_path, {0: "a", 1: "b"}, SlurmStates(slurm, slurm.clock), slurm.clock,
                             slurm.clock.sleep)
    assert follower.codes() == {0: 0, 1: 0}
    asked = slurm.times("sacct")
    assert asked[:11] == pytest.approx(range(11))  # every second at first
    ended = next(i for i, t in enumerate(asked) if t >= 100)  # task 0's end seen: a change, the next a second later
    assert asked[ended] - 100 <= 10 and asked[ended + 1] - asked[ended] == pytest.approx(1.0)
    assert 400 <= asked[-1] <= 430 and len(asked) == 82  # over 417 s, not 417
    assert 25 < max(b - a for a, b in zip(asked, asked[1:])) <= 30.0


@pytest.mark.unit
def test_the_stop_signal_goes_to_every_arrays_running_jobs_and_the_pending_ones_are_cancelled(tmp_path, capsys):
    """kill -USR1 <pid of run> while it follows a sweep: every job not ended gets its marker; the arrays whose jobs
    have not all ended get scancel --state=PENDING, then scancel --signal=USR1 --batch. A job that checkpointed
    and returned ends 0; one cancelled before it started (gone from Slurm's lists, as the test cluster shows it)
    is stopped by the signal; one that had ended already keeps its status."""
    slurm = Slurm(Clock())
    clock, stopped = slurm.clock, []

    def sacct() -> subprocess.CompletedProcess:  # array 90: task 0 runs, 1 waits (throttled); array 91: 2 ended
        after = clock.now - stopped[0] if stopped else -1.0
        task0 = "COMPLETED" if after > 20 else "RUNNING"
        task1 = "" if stopped else "90_[1]|PENDING|0:0|None assigned|JobArrayTaskLimit\n"
        return ok(f"90_0|{task0}|0:0|node1|None\n{task1}91_2|COMPLETED|0:0|node2|None\n")

    slurm.answers["sacct"] = sacct
    slurm.answers["scancel"] = ok("")
    members = {n: _member(tmp_path / str(n), (f"#SBATCH --nodes={1 + n // 2}",)) for n in range(3)}
    for member in members.values():
        member.folder.mkdir()
    (small, big) = group(members)
    follower = ArrayFollower([("90", small), ("91", big)], tmp_path, {0: "a", 1: "b", 2: "c"},
                             SlurmStates(slurm, clock), clock, clock.sleep,
                             stop=lambda ids, signum: ask_to_stop(ids, signum, slurm))

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if clock.now >= 100 and not stopped:
            stopped.append(clock.now)
            follower.on_stop(signal.SIGUSR1)

    follower._sleep = sleep
    codes = follower.codes()
    assert codes == {0: 0, 1: 128 + signal.SIGUSR1, 2: 0}
    assert [argv for _, argv in slurm.calls if argv[0] == "scancel"] == [
        ["scancel", "--state=PENDING", "90"], ["scancel", "--signal=USR1", "--batch", "90"]]
    assert [(tmp_path / str(n) / "user_stop").exists() for n in range(3)] == [True, True, False]
    assert "SIGUSR1: asking Slurm job array(s) 90 to checkpoint and stop (scancel --signal=USR1 --batch 90), then " \
           "following to the end (Ctrl-C cancels)" in capsys.readouterr().err
    follower.on_stop(signal.SIGUSR1)  # every job ended: nothing more to ask
    assert len(slurm.times("scancel")) == 2


def test_the_array_script_runs_each_jobs_own_script_in_its_folder(tmp_path):
    sweep = tmp_path / "sweep dir"  # a space: every path is quoted
    directives = ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --signal=B:USR1@90")
    members = {n: _member(sweep / str(n), directives, p) for n, p in [(1, 4), (3, 2), (7, None)]}
    (array,) = group(members)
    text = array.script(sweep, "run-sweep-x-0")
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert "#SBATCH --array=1,3,7%2" in lines  # the task ids are the sweep's job numbers; the smallest limit
    assert f"#SBATCH --output='{sweep}/slurm-%A_%a.out'" in lines
    assert all(d in lines for d in directives)
    for n in (1, 3, 7):
        assert f"  {n}) folder='{sweep / str(n)}' ;;" in lines
    assert lines[-1] == ('exec bash "$folder/job.sbatch" >>"$folder/slurm-${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}'
                         '.out" 2>&1')
    # bash accepts it, and a task id outside the sweep is refused
    script = tmp_path / "array.sbatch"
    script.write_text(text)
    done = subprocess.run(["bash", str(script)], env={"SLURM_ARRAY_TASK_ID": "5", "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True)
    assert done.returncode == 2 and "array task 5 is not a job of this sweep" in done.stderr


def _sweep_folder(cwd: Path) -> Path:
    (folder,) = [p for p in (cwd / "outputs" / "multirun").glob("*/*") if (p / "multirun.yaml").exists()]
    return folder


def _summary(sweep: Path) -> list[dict[str, str]]:
    with open(sweep / "summary.csv") as f:
        return list(csv.DictReader(f))


def test_a_sweep_goes_to_slurm_as_one_array_per_shape(testbed, tmp_path):
    done = run("-m", "topology=1x1,2x1", "recipe.seed=1,2", "recipe.epochs=2", "launcher=slurm", cwd=tmp_path,
               env=testbed.env(), timeout=280)  # (2 minutes on this 2-core machine alone; beside the suite's other
    # workers, once over 3: four jobs composed, four digits runs on two CPUs, and the sweep's plot)
    assert done.code == 0, done.output
    assert done.stderr.count("slurm: submitted job array") == 2, done.output
    sweep = _sweep_folder(tmp_path)
    rows = _summary(sweep)
    assert [(r["configuration"].split()[0], r["world size"], r["status"]) for r in rows] == \
        [("topology=1x1", "1", "done"), ("topology=1x1", "1", "done"), ("topology=2x1", "2", "done"),
         ("topology=2x1", "2", "done")]
    assert all(float(r["test_accuracy"]) > 0.8 and float(r["throughput (samples/s)"]) > 0 for r in rows)
    ids = {n: (sweep / str(n) / "slurm_job_id").read_text().strip() for n in range(4)}
    arrays = {n: ids[n].split("_") for n in ids}
    assert [a[1] for a in arrays.values()] == ["0", "1", "2", "3"]  # task id = the job's number in the sweep
    assert arrays[0][0] == arrays[1][0] != arrays[2][0] == arrays[3][0]  # one array per shape
    for n, job in ids.items():
        folder = sweep / str(n)
        assert "final test accuracy" in (folder / f"slurm-{job}.out").read_text()
        assert (folder / "exit_status").read_text() == "0\n"
    # the 2x1 jobs ran across both nodes, each host choosing its own route
    both = testbed.hosts[0].name[:-1] + "[1-2]"  # Slurm's form of the two nodes' names
    for n in (2, 3):
        running = [line for line in done.stderr.splitlines() if line.startswith(f"slurm job {ids[n]} (sweep job {n}: ")
                   and "RUNNING on" in line]
        assert running and running[0].endswith(f"RUNNING on {both}"), done.stderr
        assert "network: GLOO_SOCKET_IFNAME=lan0" in (sweep / str(n) / "logs" / "rank00001.log").read_text()
    assert not list(sweep.glob("slurm-*.out"))  # the arrays' own outputs were empty, and removed
    assert (sweep / "scaling.png").exists() and (sweep / "array0.sbatch").exists()


def test_a_failing_job_of_a_slurm_sweep_does_not_stop_the_others(testbed, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    done = run("-m", "topology=1x2", "launcher=slurm", "recipe=custom", "recipe.target=workloads.flaky:main",
               f"+recipe.out_dir={out}", "+recipe.steps=20", "+recipe.every=5", "+recipe.fail_rank=1",
               "+recipe.fail_step=3", "+recipe.fail_attempts=1,0", cwd=tmp_path, env=testbed.env())
    assert done.code == 1, done.output
    assert "1 of 2 job(s) of the sweep failed" in done.stderr
    sweep = _sweep_folder(tmp_path)
    assert [r["status"] for r in _summary(sweep)] == ["failed (exit 1)", "done"]
    # the failed job's own output is shown: the rank's traceback
    assert "sweep job 0 (" in done.stderr and "failed (exit 1)" in done.stderr
    assert "RuntimeError: injected failure at step 3, attempt 0" in done.stderr
    assert (sweep / "1" / "exit_status").read_text() == "0\n"


def test_follow_false_leaves_the_arrays_to_slurm(testbed, tmp_path):
    done = run("-m", "topology=1x1,1x2", "recipe.epochs=1", "launcher=slurm", "launcher.slurm.follow=false",
               "launcher.slurm.array_parallelism=1", cwd=tmp_path, env=testbed.env())
    assert done.code == 0, done.output
    sweep = _sweep_folder(tmp_path)
    ids = [(sweep / str(n) / "slurm_job_id").read_text().strip() for n in range(2)]
    assert [r["status"] for r in _summary(sweep)] == [f"submitted (slurm job {i})" for i in ids]
    assert "#SBATCH --array=0%1" in (sweep / "array0.sbatch").read_text()
    assert "not following array" in done.stderr
    # Slurm runs them on its own; wait for them, so that the test leaves nothing behind
    try:
        wait_until(lambda: all("final test accuracy" in _read(sweep / str(n) / f"slurm-{i}.out")
                               for n, i in enumerate(ids)), 120, "the unfollowed arrays finished")
    finally:
        subprocess.run(["scancel", *(i.split("_")[0] for i in ids)], env=testbed.env())


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def test_a_dry_run_sweep_submits_nothing(testbed, tmp_path):
    done = run("-m", "topology=1x2,2x2", "launcher=slurm", "dry_run=true", cwd=tmp_path, env=testbed.env())
    assert done.code == 0, done.output
    assert "submitted" not in done.stderr and done.stdout.count("#SBATCH --nodes=") == 2
    sweep = _sweep_folder(tmp_path)
    assert [r["status"] for r in _summary(sweep)] == ["dry run", "dry run"]
    assert not list(sweep.glob("array*.sbatch"))


def test_ctrl_c_cancels_every_array_and_leaves_nothing_running(testbed, tmp_path):
    run_id = f"sweepint-{uuid.uuid4().hex[:8]}"
    done = signal_when_ready(["-m", "topology=1x1,2x1", *_paced(tmp_path), "launcher=slurm", f"run_id={run_id}"],
                             tmp_path, signal.SIGINT, SAVED, count=2, timeout=300,
                             env=testbed.env())  # both jobs are training
    out = done.output
    assert done.code == 130, out
    assert "SIGINT: cancelling Slurm job array(s)" in out
    sweep = _sweep_folder(tmp_path)
    arrays = {(sweep / str(n) / "slurm_job_id").read_text().split("_")[0] for n in range(2)}
    queue = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(sorted(arrays))], env=testbed.env(),
                           capture_output=True, text=True).stdout.split()
    assert not queue, queue  # cancelled, not left running
    assert [r["status"] for r in _summary(sweep)] == ["stopped (SIGINT)", "stopped (SIGINT)"]
    ids = [run_id, f"{run_id}-0", f"{run_id}-1"]  # `run`, and each job's ranks (a sweep's jobs get -<num>)
    # the ranks on the nodes end once Slurm has cancelled their steps
    wait_until(lambda: not any(processes_of(i) for i in ids), 30, "every rank of the sweep gone")


def test_the_stop_signal_checkpoints_every_running_job_and_cancels_those_not_started(testbed, tmp_path):
    """kill -USR1 <pid of run> while it follows a sweep's arrays (one per shape, one job of each at a time): the
    running job of each array checkpoints and returns (not requeued), the job waiting behind it is cancelled before
    it starts; `run` says the sweep was stopped by the signal."""
    import torch

    run_id = f"sweepusr-{uuid.uuid4().hex[:8]}"
    done = signal_when_ready(["-m", "topology=1x1,2x1", "recipe.seed=1,2", *_paced(tmp_path), "launcher=slurm",
                              "launcher.slurm.requeue=true", "launcher.slurm.array_parallelism=1", f"run_id={run_id}"],
                             tmp_path, signal.SIGUSR1, SAVED, count=2, timeout=300,
                             env=testbed.env())  # the first job of each array is training
    out = done.output
    assert done.code == 128 + signal.SIGUSR1, out
    sweep = _sweep_folder(tmp_path)
    ids = {n: (sweep / str(n) / "slurm_job_id").read_text().strip() for n in range(4)}
    arrays = sorted({ids[n].split("_")[0] for n in ids})
    assert f"SIGUSR1: asking Slurm job array(s) {', '.join(arrays)} to checkpoint and stop" in done.stderr, out
    assert "the sweep was stopped (SIGUSR1) after 4 job(s)" in done.stderr
    assert [r["status"] for r in _summary(sweep)] == ["stopped on request", "stopped (SIGUSR1)"] * 2
    for n in (0, 2):  # ran: checkpointed at the stop, the job ended there
        folder = sweep / str(n)
        output = (folder / f"slurm-{ids[n]}.out").read_text()
        assert "stop requested: checkpoint at step" in output
        assert "run: stopped at the user's request (user_stop)" in output and "requeueing" not in output
        assert torch.load(folder / "checkpoints" / "last.pt", weights_only=True)["step"] % EVERY == 0
    for n in (1, 3):  # waited behind it: never started
        assert not list((sweep / str(n) / "logs").glob("rank*.log"))
    queue = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(arrays)], env=testbed.env(),
                           capture_output=True, text=True).stdout.split()
    assert not queue, queue
    ids_of_run = [run_id] + [f"{run_id}-{n}" for n in range(4)]
    assert not any(processes_of(i) for i in ids_of_run)
