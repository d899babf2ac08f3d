"""runner.launchers.slurm.job: what Slurm says of a job, from sacct in one call for many jobs, and from scontrol
where sacct does not answer (no accounting kept, as on the test cluster; asked again later) or does not list a job
yet. Slurm's commands and the clock are fakes: pure logic. Following a job: test_follow.py."""

from __future__ import annotations

import subprocess

import pytest

from runner.launchers.slurm.job import JobStatus, SlurmStates, task_ids
from slurm_fakes import Clock, Slurm, ok

pytestmark = pytest.mark.unit

SACCT = """\
4242|COMPLETED|0:0|gpu[01-02]|None
4243|CANCELLED by 0|0:15|gpu03|None
4244_0|RUNNING|0:0|gpu04|None
4244_1|FAILED|1:0|gpu05|NonZeroExitCode
4244_[2-4%2]|PENDING|0:0|None assigned|JobArrayTaskLimit
"""
SCONTROL = ("JobId=51 JobName=run-x UserId=root(0) JobState=RUNNING Reason=None Restarts=1 ExitCode=0:0 "
            "NodeList=tb1h[1-2]\nJobId=53 ArrayJobId=52 ArrayTaskId=0,2-3 JobState=PENDING Reason=Priority "
            "ExitCode=0:0 NodeList=(null)\n")


def test_sacct_lines() -> None:
    parsed = [JobStatus.parse_sacct(line) for line in SACCT.splitlines()]
    assert parsed[0] == JobStatus(job="4242", state="COMPLETED", reason="None", nodes="gpu[01-02]")
    assert parsed[1].state == "CANCELLED" and parsed[1].exit_signal == 15 and parsed[1].finished
    assert (parsed[2].job, parsed[2].tasks, parsed[2].state) == ("4244", (0,), "RUNNING")
    assert (parsed[3].tasks, parsed[3].exit_code, parsed[3].reason) == ((1,), 1, "NonZeroExitCode")
    assert (parsed[4].tasks, parsed[4].state, parsed[4].finished) == ((2, 3, 4), "PENDING", False)
    assert JobStatus.parse_sacct("garbage") is None


def test_scontrol_records() -> None:
    job, array = (JobStatus.parse(line) for line in SCONTROL.splitlines())
    assert (job.job, job.state, job.restarts, job.nodes, job.tasks) == ("51", "RUNNING", 1, "tb1h[1-2]", ())
    assert job.describe() == "RUNNING on tb1h[1-2], restart 1"
    assert (array.job, array.tasks, array.describe()) == ("52", (0, 2, 3), "PENDING (Priority)")
    assert task_ids("[0,2-4%2]") == (0, 2, 3, 4)


@pytest.fixture
def slurm() -> Slurm:
    return Slurm(Clock())


NO_ACCOUNTING = subprocess.CompletedProcess([], 1, "", "sacct: error: Slurm accounting storage is disabled\n")


def test_one_sacct_call_for_every_job_asked(slurm) -> None:
    slurm.answers["sacct"] = ok(SACCT)
    found = SlurmStates(slurm, slurm.clock).of(["4242", "4243", "4244"])
    assert [argv[0] for _, argv in slurm.calls] == ["sacct"] and slurm.calls[0][1][-1] == "4242,4243,4244"
    assert {s.job for s in found} == {"4242", "4243", "4244"}


def test_without_accounting_scontrol_answers(slurm) -> None:
    slurm.answers["sacct"] = NO_ACCOUNTING
    slurm.answers["scontrol"] = ok(SCONTROL.splitlines()[0] + "\n")
    states = SlurmStates(slurm, slurm.clock)
    assert states.status("51").state == "RUNNING"
    slurm.clock.now = 1.0
    assert states.status("51").state == "RUNNING"
    assert [argv[0] for _, argv in slurm.calls] == ["sacct", "scontrol", "scontrol"]  # sacct: not again at once


def test_a_failed_sacct_is_asked_again_later_and_later_and_used_again_once_it_answers(slurm) -> None:
    answers = {"works": False}
    slurm.answers["sacct"] = lambda: ok("51|RUNNING|0:0|tb1h1|None\n") if answers["works"] else NO_ACCOUNTING
    slurm.answers["scontrol"] = ok(SCONTROL.splitlines()[0] + "\n")
    states = SlurmStates(slurm, slurm.clock)
    for t in range(2200):  # asked every second, as a job is followed at its busiest
        slurm.clock.now = float(t)
        assert states.status("51").state == "RUNNING"
    # 30 s after the first failure, then twice as late after each one, up to 10 minutes
    assert slurm.times("sacct") == [0, 30, 90, 210, 450, 930, 1530, 2130]
    assert len(slurm.times("scontrol")) == 2200  # meanwhile scontrol answers, every time
    answers["works"] = True
    for t in range(2730, 2733):
        slurm.clock.now = float(t)
        assert states.status("51").state == "RUNNING"
    assert slurm.times("sacct")[-3:] == [2730, 2731, 2732] and slurm.times("scontrol")[-1] < 2730
    answers["works"] = False  # a failure after it answered again: 30 s, as at first
    slurm.clock.now = 2733.0
    states.status("51")
    slurm.clock.now = 2762.0
    states.status("51")
    slurm.clock.now = 2763.0
    states.status("51")
    assert slurm.times("sacct")[-2:] == [2733, 2763]


def test_a_job_sacct_has_not_listed_yet_is_asked_of_scontrol(slurm) -> None:
    slurm.answers["sacct"] = ok(SACCT.splitlines()[0] + "\n")
    slurm.answers["scontrol"] = subprocess.CompletedProcess([], 1, "", "slurm_load_jobs error: Invalid job id specified\n")
    found = SlurmStates(slurm, slurm.clock).of(["4242", "4300"])
    assert [s.job for s in found] == ["4242"]  # 4300: forgotten by scontrol too, so no record
    assert slurm.calls[1][1] == ["scontrol", "show", "job", "-o", "4300"]
