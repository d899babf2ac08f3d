"""launcher=slurm's pure logic: job states, the stop signal, a task's place (patched environments), the launch's
outcome, and a job that outlives its nodes (the allocation fit: test_rules_slurm.py; the batch script under bash:
test_sbatch.py; the real cluster is in test_slurm_cluster.py)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from conftest import environment, validate
from runner.app.task import verify_place
from runner.common.signals import parse_signal
from runner.environments.slurm import SlurmEnvironment, expand_counts
from runner.launchers import Invocation, plan_for
from runner.launchers.base import LaunchOutcome, TaskError, TaskPlace
from runner.launchers.slurm.job import JobStatus, exit_status
from runner.launchers.slurm import launcher as launcher_module
from runner.launchers.slurm.launcher import SlurmLauncher
from runner.launchers.slurm.rules import allocation_problems
from runner.records.paths import RunPaths

pytestmark = pytest.mark.unit

SHOW_JOB = ("JobId=42 JobName=run-R1 UserId=root(0) JobState={state} Reason={reason} Dependency=(null) "
            "Requeue=1 Restarts={restarts} BatchFlag=1 ExitCode={code} RunTime=00:00:07 NodeList={nodes} "
            "Command=/runs/R1/job.sbatch WorkDir=/work/proj StdOut=/runs/R1/slurm-42.out")


def _status(state="RUNNING", reason="None", restarts=0, code="0:0", nodes="h[1-2]") -> JobStatus:
    return JobStatus.parse(SHOW_JOB.format(state=state, reason=reason, restarts=restarts, code=code, nodes=nodes))


def test_job_status_is_read_from_scontrol():
    running = _status()
    assert (running.state, running.nodes, running.finished) == ("RUNNING", "h[1-2]", False)
    assert running.describe() == "RUNNING on h[1-2]"
    pending = _status("PENDING", "BeginTime", restarts=1, nodes="(null)")
    assert pending.describe() == "PENDING (BeginTime), restart 1"
    failed = _status("FAILED", "NonZeroExitCode", code="3:0")
    assert failed.finished and (failed.exit_code, failed.exit_signal) == (3, 0)
    assert _status("COMPLETING").finished is False  # still on its way out


def test_exit_status_of_a_finished_job(capsys):
    assert exit_status("42", _status("COMPLETED")) == 0
    assert exit_status("42", _status("FAILED", code="3:0")) == 3
    assert exit_status("42", _status("TIMEOUT", code="0:15")) == 1
    err = capsys.readouterr().err
    assert "ended TIMEOUT (exit code 0, signal 15): it reached its time limit (launcher.slurm.time)" in err


@pytest.mark.parametrize("text, counts", [("2(x3),1", (2, 2, 2, 1)), ("8", (8,)), ("4,2", (4, 2)), ("", None),
                                          ("garbage", None)])
def test_compressed_counts(text, counts):
    assert expand_counts(text) == counts


@pytest.mark.parametrize("value, sig", [("USR1@90", signal.SIGUSR1), ("B:USR2@300", signal.SIGUSR2),
                                        ("SIGTERM", signal.SIGTERM), ("RB:SIGUSR1@60", signal.SIGUSR1),
                                        ("10@30", signal.Signals(10)), (None, signal.SIGUSR1)])
def test_stop_signal(value, sig):
    assert parse_signal(value) == sig


def _launcher(*overrides: str) -> SlurmLauncher:
    checked = validate(["launcher=slurm", "device=cpu", *overrides])
    assert checked.job is not None, checked.problems
    paths = RunPaths(Path("/runs/R1"), "R1")
    return SlurmLauncher(plan=plan_for(checked.job, paths), paths=paths,
                         invocation=Invocation(python="/venv/bin/python", cwd="/work/proj"), environment=environment())


def _allocation(**variables: str) -> SlurmEnvironment:
    return SlurmEnvironment.read({"SLURM_JOB_ID": "42", **variables})


def _place(**kw) -> TaskPlace:
    return TaskPlace(**{"index": 0, "count": 4, "local_index": 0, "source": "Slurm", **kw})


def test_a_step_on_the_wrong_number_of_nodes_is_refused():
    plan = _launcher("topology=2x2", "launcher.tasks=per_device").plan
    verify_place(plan, _place(nodes=2, tasks_per_node=(2, 2)))
    with pytest.raises(TaskError, match=r"started the step on 1 node\(s\), but the spec has 2 host\(s\)"):
        verify_place(plan, _place(nodes=1, tasks_per_node=(4,)))
    with pytest.raises(TaskError, match=r"placed 3\+1 task\(s\) on the step's nodes, but the spec needs 2\+2"):
        verify_place(plan, _place(nodes=2, tasks_per_node=(3, 1)))


def test_slurm_environment_reads_the_step():
    env = SlurmEnvironment.read({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "2",
                                 "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_TASKS_PER_NODE": "2,1",
                                 "SLURMD_NODENAME": "gpu-node02", "SLURM_RESTART_COUNT": "1",
                                 "SLURM_JOB_CPUS_PER_NODE": "8(x2)"})
    assert (env.step_num_nodes, env.step_tasks_per_node, env.node_name, env.restart_count) == (2, (2, 1), "gpu-node02", 1)
    assert env.cpus_per_node == (8, 8)


def test_a_task_plans_the_run_with_the_first_node_of_its_step_and_the_port_of_its_job():
    """The master is left to the launch under Slurm; each task's launcher fills it in from the task's variables,
    unless the spec names it."""
    paths = RunPaths(Path("/runs/R1"), "R1")
    step = environment(SLURM_JOB_ID="42", SLURM_STEP_ID="0", SLURM_STEP_NODELIST="gpu-node[07-08]")
    job = validate(["launcher=slurm", "device=cpu", "topology=2x2", "init=tcp"]).job
    plan = SlurmLauncher.host_plan(job, paths, step)
    assert (plan.master_addr, plan.master_port, plan.init_method) == ("gpu-node07", "20042", "tcp://gpu-node07:20042")
    assert SlurmLauncher.resolved(SlurmLauncher.plan_for(job, paths), step) == plan
    named = validate(["launcher=slurm", "device=cpu", "topology=2x2", "init=tcp", "init.master_addr=10.0.0.5",
                      "init.master_port=29400"]).job
    plan = SlurmLauncher.host_plan(named, paths, step)
    assert (plan.master_addr, plan.master_port, plan.init_method) == ("10.0.0.5", "29400", "tcp://10.0.0.5:29400")


def test_a_job_submitted_and_not_followed_is_the_launchs_outcome(tmp_path, monkeypatch, capsys):
    checked = validate(["launcher=slurm", "device=cpu", "topology=2x1", "launcher.slurm.follow=false"])
    paths = RunPaths(tmp_path, "R1")
    paths.make()
    monkeypatch.setattr(launcher_module, "submit", lambda script, cwd: "4242")
    chosen = SlurmLauncher(plan=plan_for(checked.job, paths), paths=paths,
                           invocation=Invocation(python="/venv/bin/python", cwd="/work/proj"), environment=environment())
    assert chosen.launch(chosen.request()) == LaunchOutcome(code=0, not_followed="Slurm job 4242")
    assert "not following it (launcher.slurm.follow=false)" in capsys.readouterr().err


# --------------------------------------------------------------------------- a job that outlives its nodes

ELASTIC = ("topology=custom", "topology.hosts=[{name: n1, devices: 2},{name: n2, devices: 2}]",
           "topology.spares=[{name: n3, devices: 2}]", "topology.min_nodes=1", "launcher.max_restarts=2",
           "recipe.global_batch_size=8")


def test_a_job_that_outlives_its_nodes_asks_for_its_spares_keeps_its_allocation_and_runs_the_holding_run():
    launcher = _launcher(*ELASTIC)
    script = launcher.sbatch().materialize()
    assert "#SBATCH --nodes=3" in script and "#SBATCH --nodelist=n1,n2,n3" in script
    assert "#SBATCH --no-kill" in script and "srun --" not in script
    assert "/venv/bin/python -P -m runner.app.slurm_rounds /runs/R1/spec.yaml &" in script
    said = [c.host for c in launcher.request().commands if c.argv is None]
    assert said[0].startswith("a lost host ends the attempt; the job restarts from the last checkpoint")
    assert said[1] == ("each round an srun step on the nodes that remain (runner.app.slurm_rounds); a node is lost when "
                       "its task is silent for 8 s (launcher.slurm.keepalive_s=2) or Slurm takes it out of the job; "
                       "spare node(s) n3 idle in the allocation until one takes a place")
    (problem,) = allocation_problems(launcher.plan,
                                     _allocation(SLURM_JOB_NUM_NODES="2", SLURM_JOB_CPUS_PER_NODE="4(x2)"))
    assert "has 2 node(s) (SLURM_JOB_NUM_NODES), the spec needs 3" in problem.message  # the spare is a node too
    plain = _launcher("topology=2x2").sbatch().materialize()
    assert "--no-kill" not in plain and "runner.app.slurm_rounds" not in plain


def test_inside_an_allocation_the_step_script_is_the_holding_run():
    launcher = _launcher(*ELASTIC)
    launcher.environment = environment(SLURM_JOB_ID="42")
    request = launcher.request()
    (text,) = request.files.values()
    assert text.rstrip().endswith("exec /venv/bin/python -P -m runner.app.slurm_rounds /runs/R1/spec.yaml")
