"""runner.launchers.slurm_job: what Slurm says of a job, from sacct in one call for many jobs, and from
scontrol where sacct does not answer (no accounting kept, as on the test cluster) or does not list a job yet."""

from __future__ import annotations

import subprocess

import pytest

from runner.launchers import slurm_job
from runner.launchers.slurm_job import JobStatus, statuses, task_ids

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
    assert parsed[0] == JobStatus("4242", "COMPLETED", "None", 0, 0, "gpu[01-02]")
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
def slurm(monkeypatch):
    """Slurm's commands answered from a table; the calls made, in order."""
    calls: list[list[str]] = []
    answers: dict[str, subprocess.CompletedProcess] = {}

    def fake(argv: list[str], cwd: str | None = None) -> subprocess.CompletedProcess:
        calls.append(argv)
        return answers[argv[0]]

    monkeypatch.setattr(slurm_job, "_slurm", fake)
    monkeypatch.setattr(slurm_job._Sacct, "works", None)
    return calls, answers


def test_one_sacct_call_for_every_job_asked(slurm) -> None:
    calls, answers = slurm
    answers["sacct"] = subprocess.CompletedProcess([], 0, SACCT, "")
    found = statuses(["4242", "4243", "4244"])
    assert [c[0] for c in calls] == ["sacct"] and calls[0][-1] == "4242,4243,4244"
    assert {s.job for s in found} == {"4242", "4243", "4244"}


def test_without_accounting_scontrol_answers_and_sacct_is_not_asked_again(slurm) -> None:
    calls, answers = slurm
    answers["sacct"] = subprocess.CompletedProcess([], 1, "", "sacct: error: Slurm accounting storage is disabled\n")
    answers["scontrol"] = subprocess.CompletedProcess([], 0, SCONTROL.splitlines()[0] + "\n", "")
    assert slurm_job.status("51").state == "RUNNING"
    assert slurm_job.status("51").state == "RUNNING"
    assert [c[0] for c in calls] == ["sacct", "scontrol", "scontrol"]


def test_a_job_sacct_has_not_listed_yet_is_asked_of_scontrol(slurm) -> None:
    calls, answers = slurm
    answers["sacct"] = subprocess.CompletedProcess([], 0, SACCT.splitlines()[0] + "\n", "")
    answers["scontrol"] = subprocess.CompletedProcess([], 1, "", "slurm_load_jobs error: Invalid job id specified\n")
    found = statuses(["4242", "4300"])
    assert [s.job for s in found] == ["4242"]  # 4300: forgotten by scontrol too, so no record
    assert calls[1] == ["scontrol", "show", "job", "-o", "4300"]
