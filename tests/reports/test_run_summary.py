"""The end-of-run summary (runner/run_summary.py): one screen on stderr and run_summary.json, for a run that
succeeds, one whose rank fails, one stopped by SIGINT, one the launch refuses (real `run` processes), and
the Slurm and signal wordings from a plan and a run folder."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import validate
from runner.launchers import plan_for
from runner.records.outcomes import RankOutcome
from runner.records.paths import RunPaths
from runner.reports.run_summary import summarize
from runner.worker.failures import agent_seen_error
from runs import TESTS, nothing_left, run, run_folder, running, signal_when_ready, wait_for_pids

pytestmark = pytest.mark.timeout(240)


def summary_of(stderr: str, run_id: str) -> list[str]:
    """The summary's lines: from its headline to the end of stderr."""
    start = stderr.index(f"== run {run_id}: ")
    return stderr[start:].rstrip("\n").splitlines()


def field(lines: list[str], name: str) -> str:
    (line,) = [line for line in lines if line.startswith(f"  {name} ")]
    return line[len(name) + 2:].strip()


def document(tmp_path: Path) -> dict:
    return json.loads((run_folder(tmp_path) / "run_summary.json").read_text())


def failing(out_dir: Path, fail_rank: int, fail_step: int, ranks: int = 2) -> list[str]:
    """Ranks that all-reduce until rank ``fail_rank`` raises at ``fail_step`` (-1: none does)."""
    return [f"topology=1x{ranks}", "recipe=custom", "recipe.target=workloads.failing:main", f"+recipe.out_dir={out_dir}",
            f"+recipe.fail_rank={fail_rank}", f"+recipe.fail_step={fail_step}", f"recipe.global_batch_size={ranks}"]


# ------------------------------------------------------------------------------ real runs


def test_a_run_that_succeeds_ends_with_its_summary_and_writes_it_as_json(tmp_path):
    done = run("topology=1x2", "recipe=custom", "recipe.target=workloads.progress:main", "+recipe.steps=20",
               "recipe.global_batch_size=32", cwd=tmp_path)
    assert done.code == 0, done.output
    lines = summary_of(done.stderr, done.run_id)
    assert len(lines) <= 12 and "== run " not in done.stdout
    assert re.fullmatch(rf"== run {done.run_id}: done in \d+\.\d s ==", lines[0])
    assert field(lines, "job") == ("1 host x 2 processes · cpu · gloo · ddp · sharding=none · launcher=local · "
                                   "workloads.progress:main")
    assert field(lines, "status") == "done: every rank returned (exit 0)"
    assert field(lines, "metrics") == "step 20: world=2"  # the last row's numbers; its flag and time left out
    folder = run_folder(tmp_path)
    assert field(lines, "outputs") == f"{folder.relative_to(tmp_path)}/"  # relative: the run's cwd holds it
    listed = " ".join(lines[lines.index(f"  outputs   {folder.relative_to(tmp_path)}/") + 1:])
    for item in ("logs/rank*.log (2)", "metrics.jsonl", "spec.yaml", "plan.json", "launch.txt", "run_summary.json"):
        assert item in listed, item
    assert "error.json" not in listed and "checkpoints" not in listed  # only what the run left

    doc = document(tmp_path)
    assert (doc["run_id"], doc["status"], doc["exit_code"], doc["world_size"]) == (done.run_id, "done", 0, 2)
    assert doc["status_text"] == "done: every rank returned (exit 0)" and doc["first_failure"] is None
    assert doc["final_metrics"] == {"world": 2.0} and doc["metrics_step"] == 20
    assert doc["wall_time_s"] > 0 and doc["processes_per_host"] == [2] and doc["launcher"] == "local"
    assert doc["paths"]["run_folder"] == str(folder)
    assert [Path(p).name for p in doc["paths"]["logs"]] == ["rank00000.log", "rank00001.log"]
    assert all(Path(p).exists() for p in [*doc["paths"]["logs"], doc["paths"]["metrics"], doc["paths"]["plan"]])


def test_a_run_whose_rank_fails_names_that_rank_first(tmp_path):
    art = tmp_path / "art"
    art.mkdir()
    done = run(*failing(art, 1, 3), cwd=tmp_path)
    assert done.code == 1
    lines = summary_of(done.stderr, done.run_id)
    assert re.fullmatch(rf"== run {done.run_id}: failed after \d+\.\d s ==", lines[0])
    assert field(lines, "status").startswith(
        "failed (exit 1): rank 1 on host node0 raised RuntimeError: injected failure on rank 1 at step 3")
    assert "logs/rank*.error.json" in " ".join(lines)
    assert done.stderr.index("== job failed ==") < done.stderr.index(lines[0])  # after the full report
    doc = document(tmp_path)
    assert (doc["status"], doc["exit_code"]) == ("failed", 1)
    assert doc["first_failure"] == {"rank": 1, "host": "node0",
                                    "exception": "RuntimeError: injected failure on rank 1 at step 3"}
    assert any(p.endswith("rank00001.error.json") for p in doc["paths"]["error_files"])


def test_a_run_stopped_by_sigint_says_so(tmp_path):
    art = tmp_path / "art"
    art.mkdir()
    run_id = f"int{tmp_path.name[-6:]}"
    with running(*failing(art, -1, 0, 2), run_id=run_id, cwd=tmp_path) as proc:  # collectives until stopped
        wait_for_pids(proc, art, 2)
        proc.send_signal(signal.SIGINT)
        done = proc.wait(60)
    err = done.stderr
    assert done.code == 130, err
    lines = summary_of(err, run_id)
    assert re.fullmatch(rf"== run {run_id}: stopped after \d+\.\d s ==", lines[0])
    assert field(lines, "status") == "stopped by SIGINT (exit 130)"
    doc = document(tmp_path)
    assert (doc["status"], doc["signal"], doc["exit_code"]) == ("stopped", "SIGINT", 130)
    nothing_left(run_id)


def test_a_run_asked_to_stop_says_it_stopped_on_request_not_done(tmp_path):
    """SIGUSR1 (Slurm's time-limit signal, here sent by hand) asks the recipe to checkpoint and return: exit 0,
    but the summary and a sweep's row must not read as a finished training."""
    run_id = f"usr{tmp_path.name[-6:]}"
    done = signal_when_ready(["topology=1x2", "recipe.epochs=2000", f"run_id={run_id}"], tmp_path, signal.SIGUSR1,
                             "outputs/*/*/metrics.jsonl")
    assert done.code == 0, done.output
    assert "stop requested: checkpoint at step" in done.stdout
    lines = summary_of(done.stderr, run_id)
    assert re.fullmatch(rf"== run {run_id}: stopped after \d+\.\d s ==", lines[0])
    assert field(lines, "status").startswith("stopped on request (")
    assert "run finished" not in done.output  # the host's own line is for Slurm and MPI tasks only
    assert document(tmp_path)["status"] == "stopped"
    done_file = json.loads((run_folder(tmp_path) / "logs" / "rank00001.done").read_text())
    assert done_file == {"stopped": True, "result": {"stopped": True, "steps": done_file["result"]["steps"]}}
    nothing_left(run_id)


def test_a_rank_killed_by_a_signal_is_named_first_not_the_peers_that_lost_it(tmp_path):
    art = tmp_path / "art"
    art.mkdir()
    run_id = f"kill{tmp_path.name[-6:]}"
    with running(*failing(art, -1, 0, 3), run_id=run_id, cwd=tmp_path) as proc:  # collectives until stopped
        os.kill(wait_for_pids(proc, art, 3)[1], signal.SIGKILL)
        done = proc.wait(60)
    err = done.stderr
    assert done.code == 1, err
    lines = summary_of(err, run_id)
    assert field(lines, "status").startswith(
        "failed (exit 1): rank 1 on host node0 ended: killed by SIGKILL (no Python exception)")
    failure = document(tmp_path)["first_failure"]
    assert (failure["rank"], failure["exception"]) == (1, "killed by SIGKILL (no Python exception)")
    nothing_left(run_id)


def test_a_launch_that_refuses_says_nothing_was_started(tmp_path):
    hosts = "topology.hosts=[{name: 127.0.0.1, devices: 1}, {name: 127.0.0.2, devices: 1}]"
    # which host is this one? neither name matches a non-loopback name of this machine: the launch refuses
    done = run("launcher=manual", "topology=custom", hosts, "recipe.global_batch_size=2", cwd=tmp_path)
    assert done.code == 2, done.output
    lines = summary_of(done.stderr, done.run_id)
    assert field(lines, "status").startswith("refused (exit 2): the launch did not start the job")
    assert field(lines, "job").startswith("2 hosts x 1 process · ")
    assert "logs/" not in " ".join(lines)  # no rank ran
    assert document(tmp_path)["status"] == "refused"


def test_the_summary_needs_no_torch_in_runs_own_process():
    """`run` itself never imports torch (its launch agent and the ranks do): the summary must not either."""
    code = ("import sys, runner.app.launch, runner.reports.run_summary; "
            "sys.exit(1 if 'torch' in sys.modules or 'tqdm' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], cwd=TESTS.parent).returncode == 0


# ------------------------------------------------------------------------------ from a plan and a run folder


def planned(tmp_path: Path, *overrides: str):
    checked = validate(overrides)
    assert checked.valid, checked.rendered()
    paths = RunPaths(tmp_path / "outputs" / "run", "r20261122")
    paths.make()
    return plan_for(checked.job, paths), paths


def test_a_slurm_job_submitted_and_not_followed_says_so(tmp_path):
    plan, paths = planned(tmp_path, "topology=hetero_2_1", "launcher=slurm", "launcher.tasks=per_device",
                          "launcher.slurm.follow=false", "recipe.global_batch_size=3")
    (paths.root / "slurm_job_id").write_text("4242\n")
    summary = summarize(plan, paths, 0, 0.42, not_followed="Slurm job 4242")
    assert summary.headline() == "== run r20261122: submitted in 0.4 s =="
    assert summary.status == "submitted" and summary.slurm_job_id == "4242"
    assert summary.status_text.startswith("submitted as Slurm job 4242, not followed")
    assert summary.job.startswith("2 hosts (2+1) = 3 processes · cpu · gloo · ddp · sharding=none · launcher=slurm · ")
    assert summary.document()["slurm_job_id"] == "4242"


def test_a_followed_slurm_job_names_its_job_beside_the_status(tmp_path):
    plan, paths = planned(tmp_path, "topology=1x2", "launcher=slurm")
    (paths.root / "slurm_job_id").write_text("77\n")
    for r in range(2):
        RankOutcome(paths, r).mark_done(stopped=False)
    summary = summarize(plan, paths, 0, 3.0)
    assert summary.status_text == "done: every rank returned (exit 0) · Slurm job 77"


def test_a_sigterm_stop_counts_the_ranks_that_had_returned(tmp_path):
    plan, paths = planned(tmp_path, "topology=1x2")
    RankOutcome(paths, 0).mark_done(stopped=False)
    summary = summarize(plan, paths, 128 + signal.SIGTERM, 12.0)
    assert summary.headline() == "== run r20261122: stopped after 12.0 s =="
    assert summary.status_text == "stopped by SIGTERM (exit 143); 1 of 2 rank(s) had returned"
    assert summary.signal == "SIGTERM"


def test_a_host_lost_is_the_cause_a_launcher_names_before_the_ranks(tmp_path):
    """launcher=ssh knows a host was lost, which no rank's record can say: the status names it, not the rank whose
    peer connection closed after it."""
    plan, paths = planned(tmp_path, "topology.hosts=[{name: a, devices: 1}, {name: b, devices: 1}]",
                          "topology.nodes=null", "topology.devices_per_node=null", "launcher=ssh",
                          "recipe.global_batch_size=2")
    RankOutcome(paths, 0).record_error(agent_seen_error(plan.records[0], "RuntimeError: Connection closed by peer"))
    cause = "host 1 (b) was lost: ssh exited 255 (Connection to b closed by remote host.)"
    summary = summarize(plan, paths, 1, 9.0, cause=cause)
    assert summary.status_text == f"failed (exit 1): {cause}"
    assert summary.first_failure == {"rank": None, "host": None, "exception": cause}
    assert summarize(plan, paths, 1, 9.0).status_text.startswith("failed (exit 1): rank 0 on host a ended:")


def test_a_failure_without_an_error_file_says_whether_ranks_had_started(tmp_path):
    plan, paths = planned(tmp_path, "topology=1x2")
    before = summarize(plan, paths, 1, 5.0)  # e.g. this host could not reach the master
    assert before.status == "failed" and before.first_failure is None
    assert before.status_text == "failed (exit 1): no rank started; the error above says why"
    for r in range(2):
        paths.rank(r).log.touch()
    killed = summarize(plan, paths, 1, 5.0)  # e.g. a rank killed by SIGKILL
    assert killed.status_text.startswith("failed (exit 1): no rank recorded a Python exception")


def test_a_preflight_says_what_it_checked(tmp_path):
    plan, paths = planned(tmp_path, "topology=1x2", "preflight=true")
    assert summarize(plan, paths, 1, 1.0).status_text == \
        "failed (exit 1): a preflight check failed; the host line above says which"
    for r in range(2):
        RankOutcome(paths, r).mark_done(stopped=False)
    assert summarize(plan, paths, 0, 1.0).status_text == "done: preflight passed, every rank returned (exit 0)"


def test_metrics_are_the_numbers_of_the_last_row_and_the_folder_is_shown_where_it_is(tmp_path):
    plan, paths = planned(tmp_path, "topology=1x2")
    rows = [{"step": 5, "time_s": 1.0, "loss": 0.5}, {"step": 9, "time_s": 2.5, "final": True, "acc": 0.96875,
                                                      "steps": 9, "name": "x"}]
    paths.metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (paths.checkpoints).mkdir()
    (paths.checkpoints / "last.pt").write_bytes(b"")
    summary = summarize(plan, paths, 0, 1.0)
    assert (summary.metrics_step, summary.final_metrics) == (9, {"acc": 0.96875, "steps": 9})
    screen = summary.render(tmp_path).splitlines()
    assert field(screen, "metrics") == "step 9: acc=0.9688 steps=9"
    assert field(screen, "outputs") == "outputs/run/"
    assert screen[-2:] == ["  outputs   outputs/run/",
                           "            metrics.jsonl · checkpoints/last.pt · run_summary.json"]
    elsewhere = summary.render(tmp_path / "other").splitlines()  # not under the cwd: the absolute path
    assert field(elsewhere, "outputs") == f"{paths.root}/"


def _failed_with(paths: RunPaths, exception: str, traceback: str = "") -> None:
    from runner.records.outcomes import ErrorRecord

    RankOutcome(paths, 0).record_error(ErrorRecord(rank=0, local_rank=0, host="node0", machine="m", pid=1, timestamp=1.0,
                                                   exception=exception, traceback=traceback))


def test_the_status_line_is_the_line_of_the_error_that_says_what_went_wrong(tmp_path):
    """An exception whose message begins with a newline (torch.multiprocessing's ProcessRaisedException, from any
    mp.spawn script) is told by its innermost error, not an empty line."""
    plan, paths = planned(tmp_path, "topology=1x2")
    _failed_with(paths, "ProcessRaisedException: \n\n-- Process 0 terminated with the following error:\n"
                        "Traceback (most recent call last):\n  File \"x.py\", line 3, in worker\n"
                        "RuntimeError: The server socket has failed to listen on any local network address. "
                        "port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use")
    status = summarize(plan, paths, 1, 1.0).status_text
    assert status.startswith("failed (exit 1): rank 0 on host node0 raised RuntimeError: The server socket has "
                             "failed to listen"), status


def test_a_long_error_is_cut_between_words_never_inside_a_number(tmp_path):
    """gloo's timeout was cut to "Timed out waiting 3000..." (it said 300000 ms): a cut falls between words."""
    plan, paths = planned(tmp_path, "topology=1x2")
    noise = "x" * 123  # puts the number across the 160th character
    _failed_with(paths, f"RuntimeError: {noise} Timed out waiting 300000ms for recv operation to complete")
    status = summarize(plan, paths, 1, 1.0).status_text
    assert status == f"failed (exit 1): rank 0 on host node0 raised RuntimeError: {noise} Timed out waiting…"


def test_a_script_that_ended_with_a_failure_status_is_said_to_have_ended_not_raised(tmp_path):
    plan, paths = planned(tmp_path, "recipe=script", "recipe.path=/tmp", "topology=1x2")
    _failed_with(paths, "ScriptExit: train.py exited with status 3")
    status = summarize(plan, paths, 1, 1.0).status_text
    assert status == "failed (exit 1): rank 0 on host node0 ended: train.py exited with status 3"


def test_the_job_line_names_the_backend_a_script_chose(tmp_path):
    plan, paths = planned(tmp_path, "recipe=script", "recipe.path=/tmp", "topology=1x2")
    assert summarize(plan, paths, 0, 1.0).backend == "gloo"  # before any rank joined: the spec's
    RankOutcome(paths, 0).mark_joined("nccl")
    summary = summarize(plan, paths, 0, 1.0)
    assert summary.backend == "nccl" and summary.job.startswith("1 host x 2 processes · cpu · nccl · ")
    assert summary.recipe == "script /tmp"
