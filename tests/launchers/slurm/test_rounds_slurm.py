"""runner.launchers.slurm.rounds: a Slurm job's rounds, each an srun step, and how a lost node is found. The step is
a real process here (a stand-in for srun that prints what srun relays: the tasks' report lines, srun's own lines);
Slurm's view of the job's nodes is given. The whole thing on a real cluster: tests/e2e/test_lost_nodes_slurm.py."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import make_spec, validate
from runner.launchers.slurm.launcher import SlurmLauncher
from runner.launchers.slurm.rounds import (SlurmRound, Step, last_round_plan, nodes_listed, pinned_to_nodes,
                                           read_holder_beat, rounds_run, write_holder_beat)
from runner.records.paths import RunPaths
from runner.spec.schema import TopologyConfig


def elastic_spec(nodes: int = 3, **topology: object):
    spec = make_spec(devices=[1] * nodes, launcher="slurm", global_batch_size=12)
    return dataclasses.replace(spec, topology=TopologyConfig(nodes=nodes, devices_per_node=1, min_nodes=2, **topology),
                               launcher=dataclasses.replace(spec.launcher, max_restarts=3))


@pytest.mark.unit
def test_unnamed_hosts_take_the_allocations_nodes_in_order_and_named_ones_keep_theirs() -> None:
    pinned = pinned_to_nodes(elastic_spec(), ["n7", "n8", "n9", "n10"])
    assert [(h.name, h.devices) for h in pinned.topology.hosts] == [("n7", 1), ("n8", 1), ("n9", 1)]
    assert pinned.topology.nodes is None and pinned_to_nodes(pinned, ["x", "y", "z"]) == pinned


@pytest.mark.unit
def test_the_rounds_specs_beat_and_last_plan_live_in_the_run_folder(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path, "r1")
    assert rounds_run(paths) == [] and read_holder_beat(paths) is None
    spec = pinned_to_nodes(elastic_spec(), ["a", "b", "c"])
    got = validate(spec)
    assert got.valid, got.rendered()
    job = got.job
    assert last_round_plan(paths, job, SlurmLauncher.plan_for) is None
    first = SlurmRound.of(spec, paths, job, python=sys.executable, job_id="7", planner=SlurmLauncher.plan_for, cwd=None)
    after = dataclasses.replace(spec, topology=dataclasses.replace(spec.topology, hosts=spec.topology.hosts[:2],
                                                                   min_nodes=2))
    second = first.on(after, 1)
    assert rounds_run(paths) == [0, 1] and paths.round_spec(1).exists()
    assert (second.names, second.paths.attempt, second.plan.world_size) == (("a", "b"), 1, 2)
    plan = last_round_plan(paths, job, SlurmLauncher.plan_for)
    assert plan is not None and [h.name for h in plan.job.hosts] == ["a", "b"] and plan.world_size == 2
    write_holder_beat(paths, 1, 5)
    assert read_holder_beat(paths) == (1, 5)


@pytest.mark.unit
def test_a_rounds_step_names_its_nodes_may_overlap_the_last_and_starts_tasks_of_that_round(tmp_path: Path) -> None:
    spec = pinned_to_nodes(elastic_spec(), ["a", "b", "c"])
    step = SlurmRound.of(spec, RunPaths(tmp_path, "r1", 2), validate(spec).job, python="/py", job_id="7",
                         planner=SlurmLauncher.plan_for, cwd=None)
    assert step.argv() == ["srun", "--kill-on-bad-exit=1", "--overlap", "--nodes=3", "--ntasks=3", "--ntasks-per-node=1",
                           "--distribution=block", "--nodelist=a,b,c", "--cpus-per-task=1", "/py", "-P", "-m",
                           "runner.app.task", str(tmp_path / "spec.round2.yaml"), "--round", "2"]


@pytest.mark.unit
def test_the_nodes_slurm_still_counts_in_a_job() -> None:
    assert nodes_listed("JobId=4 JobState=RUNNING NodeList=n[1-2],m3 BatchHost=n1") == {"n1", "n2", "m3"}
    assert nodes_listed("JobId=4 JobState=PENDING NodeList=(null)") is None
    assert nodes_listed("JobId=4") is None


# ------------------------------------------------------------------- a step to its end, with a stand-in for srun

FAKE_SRUN = textwrap.dedent('''
    import json, os, signal, sys, time
    REPORT = b"\\x1erunner-report "
    quiet_after = {int(k): float(v) for k, v in json.loads(sys.argv[1]).items()}  # host -> seconds it beats
    ended = json.loads(sys.argv[2])  # nodes whose tasks srun says ended once it is sent SIGTERM
    def end(*_):
        if not ended:  # no node lost: srun ends once Slurm stopped the tasks
            os._exit(143)
        for name in ended:
            os.write(2, f"srun: error: {name}: task 0: Killed\\n".encode())
        time.sleep(60)  # srun waits for the lost node: the round kills it once the others ended
    signal.signal(signal.SIGTERM, end)
    os.write(2, b"srun: a line of srun's own\\n")
    start = time.monotonic()
    while True:
        now = time.monotonic() - start
        if all(now > q for q in quiet_after.values()) and now > 30:
            sys.exit(0)
        for host, q in quiet_after.items():
            if now < q:
                os.write(2, REPORT + json.dumps({"k": "alive", "at": time.time(), "host": host}).encode() + b"\\n")
        time.sleep(0.2)
''')


class FakeRound(SlurmRound):
    def __init__(self, round_: SlurmRound, quiet_after: dict[int, float], ended: list[str]) -> None:
        self.__dict__.update(round_.__dict__)
        self.fake = [sys.executable, "-c", FAKE_SRUN, json.dumps(quiet_after), json.dumps(ended)]

    def argv(self) -> list[str]:
        return self.fake


def a_round(tmp_path: Path, quiet_after: dict[int, float], ended: list[str]) -> FakeRound:
    spec = pinned_to_nodes(elastic_spec(), ["a", "b", "c"])
    spec = dataclasses.replace(spec, launcher=dataclasses.replace(
        spec.launcher, slurm=dataclasses.replace(spec.launcher.slurm, keepalive_s=1)))
    real = SlurmRound.of(spec, RunPaths(tmp_path, "r1"), validate(spec).job, python=sys.executable, job_id="7",
                         planner=SlurmLauncher.plan_for, cwd=None)
    return FakeRound(real, quiet_after, ended)


def test_a_task_that_falls_silent_loses_its_node_and_ends_the_step(tmp_path: Path, capfd) -> None:
    heard = []
    round_ = a_round(tmp_path, {0: 99, 1: 99, 2: 1.0}, ["a", "b"])
    ended = Step(round_, lambda host, report: heard.append(host), nodes_of_job=lambda _job: None).run()
    assert ended.lost == {2} and "its task was silent for 4 s (launcher.slurm.keepalive_s=1, 4 missed)" in ended.why_lost[2]
    assert ended.code != 0 and ended.signalled is None and ended.lost_at is not None
    assert {0, 1, 2} <= set(heard)
    err = capfd.readouterr().err
    assert "srun: a line of srun's own" in err and "runner-report" not in err  # report lines are taken out
    assert "slurm: node(s) c lost (its task was silent" in err
    assert read_holder_beat(RunPaths(tmp_path, "r1"))[0] == 0  # the tasks of round 0 hear the holder


def test_slurms_word_wins_over_silence(tmp_path: Path, capfd) -> None:
    """Slurm gave node c up and killed the step's tasks on a and b: those fall silent, c's task runs on."""
    round_ = a_round(tmp_path, {0: 1.0, 1: 1.0, 2: 99}, ["a", "b"])
    ended = Step(round_, None, nodes_of_job=lambda _job: {"a", "b"}).run()
    assert ended.lost == {2} and ended.why_lost[2] == "Slurm took node c out of the job (scontrol show node c)"


def test_a_signal_to_the_holder_is_passed_to_srun_and_ends_the_job_not_the_round(tmp_path: Path) -> None:
    round_ = a_round(tmp_path, {0: 99, 1: 99, 2: 99}, [])
    sent = []

    def first_report(_host, _report) -> None:  # SIGTERM to this process (the holder) once its step runs
        if not sent:
            sent.append(os.kill(os.getpid(), signal.SIGTERM))

    ended = Step(round_, first_report, nodes_of_job=lambda _job: None).run()
    assert ended.signalled == signal.SIGTERM and not ended.lost and ended.code == 128 + signal.SIGTERM
