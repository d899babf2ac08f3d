"""One job, one story across hosts: two namespace hosts started by hand (launcher=manual), each `run` in a folder of
its own (no shared run folder, as on separate machines), telling each other through the job's channel (host 0's
store): a failure on one host ends the job on the other within seconds with the true cause, a hang is told for
every rank of every host, a stop reaches every rank, a restart of the bundled recipe resumes the same checkpoint
on every host, host 0's summary counts every rank, and the same run id names the same run folder."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from runs import (QUIT_SAID, RUN, TESTS, bed_hosts, check_readme_quotes, finish, mpi_options, nothing_left, running,
                  seen_in, stage_workloads, started, Started, wait_until)

pytestmark = pytest.mark.timeout(300)


@contextmanager
def apart(testbed, tmp_path: Path, args: list[str], run_id: str, script: tuple[str, ...] = (),
          ) -> Iterator[list[Started]]:
    """`run ARGS launcher=manual launcher.manual.host=i run_id=...` inside each host's namespace, each in its own
    folder ``tmp_path/host<i>`` (with the tests' workloads and scripts, as a user's checkout on each machine)."""
    with ExitStack() as stack:
        procs = []
        for i, host in enumerate(testbed.hosts):
            folder = stage_workloads(tmp_path / f"host{i}")
            for name in ("slow_backward.py", "hang_script.py"):
                shutil.copy(TESTS / "scripts" / name, folder)
            tail = ("--", *script) if script else ()
            argv = [RUN, *args, "launcher=manual", f"launcher.manual.host={i}", f"run_id={run_id}", *tail]
            procs.append(stack.enter_context(started(testbed.exec_argv(host, argv), cwd=folder, env=testbed.env(),
                                                     run_id=run_id, merged=True)))
        yield procs


def apart_finished(testbed, tmp_path: Path, args: list[str], run_id: str, timeout: float, script: tuple[str, ...] = (),
                   ) -> list[tuple[int, str]]:
    """:func:`apart`, waited for (runs.finish): each host's exit status and output."""
    with apart(testbed, tmp_path, args, run_id, script) as procs:
        return finish(procs, timeout)


def run_folder_of(folder: Path, run_id: str) -> Path:
    return folder / "outputs" / "runs" / run_id


# where the ranks of the stop tests are
WHERE = (r"rank 0 waits in all_reduce #4 \(process group 0\) since \d+\.\d s \(Float\[1\]\); rank 1 never entered "
         r"it: its last collective was all_reduce #3, and it is at workloads/hang\.py:16 in main")


# What the tests below see on each host's terminal, as patterns of the hosts' names: docs/across-hosts.md
# quotes these lines (test_the_readme_quotes_what_these_tests_see checks it)
SAID = {
    "hang": r"timeout: a collective waited init.timeout_s=10 s: rank 0 waits in \w+ #\d+ \(process group 0\).*rank 1 "
            r"never entered it: .*, and it is at slow_backward.py:25 in <module>",
    "peer timed out": r"rank 0 on {host0} failed: \w+: .*[Tt]imed out",
    "status timed out": r"status    failed \(exit 1\): rank 0 on host {host0} raised \w+: .*Timed out waiting 10000ms",
    # host 0 names rank 1's kill as the cause whether its own rank failed after it (the peer's connection closed: the
    # line says it was the job's first failure) or its agent stopped its rank first (on the channel's word)
    "killed": r"(the job's first failure, on another host: )?rank 1 on {host1} failed: killed by SIGKILL \(no Python "
              r"exception: killed from ",
    "restarting": r"restarting: attempt 2 of 2 \(launcher.max_restarts=1\)",
    "resumed": r"resumed from .*/host0/outputs/runs/\w+/checkpoints/last.pt: step \d+",
    "stop on host 0": r"SIGTERM: rank\(s\) 0 still running launcher.grace_s=2 s after it; killing them: " + WHERE,
    "stop reached host 1": r"SIGTERM \(to {host0}'s `run`\): asking 1 process\(es\) to checkpoint and stop",
    "stop on host 1": r"SIGTERM: rank\(s\) 1 still running launcher.grace_s=2 s after it; killing them \(host 0's agent "
                      r"says where every rank was\)",
}


def seen(key: str, testbed=None) -> str:
    """The pattern ``key`` of :data:`SAID`, for the test bed's hosts (any host name without one)."""
    return seen_in(SAID, key, testbed)


def test_a_failure_on_one_host_ends_the_job_on_every_host_with_the_true_cause(testbed, tmp_path):
    """Rank 1 (host 1) falls silent before its backward at step 5; rank 0 (host 0) times out in DDP's all-reduce
    after init.timeout_s: host 0 says which collective and where rank 1 is (not "the process group did not form":
    it had formed), and host 1's `run`, whose rank still sleeps, ends within seconds, naming host 0's failure."""
    out = tmp_path / "out"
    out.mkdir()
    run_id = f"f{uuid.uuid4().hex[:8]}"
    began = time.monotonic()
    (code0, said0), (code1, said1) = apart_finished(
        testbed, tmp_path, [*bed_hosts(testbed, [1, 1]), "init=tcp", "init.timeout_s=10"], run_id, 90,
        ("slow_backward.py", "--slow-rank", "1", "--slow-step", "5", "--out", str(out)))
    took = time.monotonic() - began
    assert (code0, code1) == (1, 1), (said0, said1)
    assert "did not form" not in said0 + said1
    assert re.search(seen("hang"), said0), said0
    assert re.search(seen("peer timed out", testbed), said1), said1
    for said in (said0, said1):  # both hosts' summaries tell the same story: rank 0 failed first, and why
        assert re.search(seen("status timed out", testbed), said), said
    assert took < 10 + 60, took  # the timeout, then a minute at most on a loaded machine: not host 1's sleeping rank's hour
    nothing_left(run_id)


def _only_rank_of(host_run: Started, deadline_s: float = 60) -> int:
    """The pid of the one rank a host other than host 0 started: the child of the zygote its launch agent started
    (`run`'s own child) that leads a session of its own (the zygote's other child there, the agent's client of host 0's
    store, does not; ranks are forked, so their environment in /proc is the zygote's)."""
    import psutil

    def ranks() -> list[psutil.Process]:
        try:
            return [child for agent in psutil.Process(host_run.pid).children() for zygote in agent.children()
                    for child in zygote.children() if os.getsid(child.pid) == child.pid]
        except psutil.Error:
            return []

    wait_until(lambda: len(ranks()) == 1, deadline_s, "the host's rank running", alive=[host_run])
    return ranks()[0].pid


def test_the_bundled_recipe_restarts_across_hosts_from_host_0s_checkpoint(testbed, tmp_path):
    """digits with launcher.max_restarts=1 on two hosts with folders of their own; rank 1 (host 1) is killed once
    host 0 has written a checkpoint: every rank resumes from that checkpoint (host 1's folder has none: the decision
    is rank 0's), the job ends on both hosts with exit 0, and host 0's summary counts both ranks."""
    run_id = f"r{uuid.uuid4().hex[:8]}"
    checkpoint = run_folder_of(tmp_path / "host0", run_id) / "checkpoints" / "last.pt"
    with apart(testbed, tmp_path, [*bed_hosts(testbed, [1, 1]), "init=tcp", "launcher.max_restarts=1",
                                   "recipe.epochs=20", "recipe.global_batch_size=64"], run_id) as procs:
        wait_until(checkpoint.exists, 120, "host 0's first checkpoint", alive=procs)
        os.kill(_only_rank_of(procs[1]), signal.SIGKILL)
        (code0, said0), (code1, said1) = finish(procs, timeout=240)
    assert (code0, code1) == (0, 0), (said0, said1)
    assert re.search(seen("resumed"), said0) and f"/outputs/runs/{run_id}/checkpoints/" in said0, said0
    assert re.search(seen("restarting"), said0) and re.search(seen("restarting"), said1), (said0, said1)
    host1 = testbed.hosts[1].name
    # host 0's rank then lost its peer: the cause both hosts name is rank 1's kill
    assert re.search(seen("killed", testbed), said0), said0
    assert f"rank 1 (host {host1}) failed first: killed by SIGKILL (no Python exception: killed from " in said1, said1
    assert not (run_folder_of(tmp_path / "host1", run_id) / "checkpoints").exists()  # rank 0 writes them
    summary = json.loads((run_folder_of(tmp_path / "host0", run_id) / "run_summary.json").read_text())
    assert summary["status"] == "done" and summary["status_text"] == "done: every rank returned (exit 0)"
    assert summary["final_metrics"]["test_accuracy"] > 0.9
    nothing_left(run_id)


def test_the_same_run_id_names_the_same_run_folder_and_a_relaunch_continues_it(testbed, tmp_path):
    """Each host's `run` puts the run in outputs/runs/<run id>/ of its folder; started again with the same run id,
    the job continues from host 0's checkpoint (the recipe resumes) instead of starting over in a new folder."""
    run_id = f"s{uuid.uuid4().hex[:8]}"
    args = [*bed_hosts(testbed, [1, 1]), "init=tcp", "recipe.epochs=2", "recipe.global_batch_size=64"]
    first = apart_finished(testbed, tmp_path, args, run_id, 120)
    assert [c for c, _ in first] == [0, 0], first
    folders = [run_folder_of(tmp_path / f"host{i}", run_id) for i in (0, 1)]
    assert all((f / "spec.yaml").exists() for f in folders)
    again = apart_finished(testbed, tmp_path, [*args[:-2], "recipe.epochs=3", "recipe.global_batch_size=64"], run_id,
                           120)
    assert [c for c, _ in again] == [0, 0], again
    said0 = again[0][1]
    assert f"notice: run_id={run_id}: " in said0 and "this launch continues it" in said0
    assert re.search(r"resumed from .*/checkpoints/last.pt: step 42, epoch 2, batch 0", said0), said0
    assert sorted(p.name for p in (tmp_path / "host0" / "outputs" / "runs").iterdir()) == [run_id]
    nothing_left(run_id)


def _hang_rank_1(marker: Path) -> list[str]:
    """Rank 1 falls silent before its 4th all-reduce (workloads/hang.py:16), writing ``marker`` first."""
    return ["recipe=custom", "recipe.target=workloads.hang:main", "+recipe.hang_rank=1", "+recipe.hang_step=3",
            f"+recipe.marker={marker}", "recipe.global_batch_size=2"]


@contextmanager
def rank_1_stuck(testbed, tmp_path: Path, run_id: str) -> Iterator[list[Started]]:
    """Each host's `run` (:func:`apart`, init=tcp, launcher.grace_s=2) once rank 1 (host 1) is stuck before its 4th
    all-reduce and rank 0 (host 0) waits in it."""
    marker = tmp_path / "rank1.stuck"
    with apart(testbed, tmp_path, [*bed_hosts(testbed, [1, 1]), "init=tcp", "init.timeout_s=300",
                                   "launcher.grace_s=2", *_hang_rank_1(marker)], run_id) as procs:
        wait_until(marker.exists, 90, "rank 1 stuck", alive=procs)
        yield procs


def test_sigterm_on_one_host_stops_every_host_and_host_0_says_where_every_rank_was(testbed, tmp_path):
    """SIGTERM to host 0's `run` while rank 1 (host 1) is stuck: the stop reaches host 1 through the channel (its
    `run` was not signalled), neither rank can honour it, and after launcher.grace_s host 0 names where rank 1 is
    on the other host. Both hosts end with 128 + SIGTERM, nothing left running."""
    run_id = f"t{uuid.uuid4().hex[:8]}"
    with rank_1_stuck(testbed, tmp_path, run_id) as procs:
        procs[0].send_signal(signal.SIGTERM)
        (code0, said0), (code1, said1) = finish(procs, timeout=60)
    assert (code0, code1) == (143, 143), (said0, said1)
    assert re.search(seen("stop on host 0"), said0), said0
    assert re.search(seen("stop reached host 1", testbed), said1), said1
    assert re.search(seen("stop on host 1"), said1), said1
    nothing_left(run_id)


def test_ctrl_backslash_on_either_host_says_where_every_rank_is_and_the_job_goes_on(testbed, tmp_path):
    """Ctrl-\\ to host 1's `run` (it serves no store and has no run folder in common with host 0): it asks every
    rank through the job's channel and says where each one is, host 0's rank included; the job goes on."""
    run_id = f"w{uuid.uuid4().hex[:8]}"
    with rank_1_stuck(testbed, tmp_path, run_id) as procs:
        procs[1].send_signal(signal.SIGQUIT)
        wait_until(lambda: procs[1].said(QUIT_SAID + "the job goes on)"), 30, "told where the ranks are", alive=procs)
        assert all(p.proc.poll() is None for p in procs)  # the job goes on
        procs[0].send_signal(signal.SIGTERM)
        (code0, said0), (code1, said1) = finish(procs, timeout=60)
    found = re.findall(r"where the ranks are: (.*)", said1)
    assert len(found) == 1 and re.match(WHERE, found[0]), said1
    assert "where the ranks are" not in said0, said0  # asked on host 1: answered there
    assert (code0, code1) == (143, 143), (said0, said1)
    nothing_left(run_id)


@pytest.mark.parametrize("launcher", ["mpi", "slurm"])
def test_a_stop_under_a_scheduler_says_where_every_rank_was_once(testbed, tmp_path, launcher):
    """SIGTERM to `run` under mpirun (a task per rank on two hosts; `run` passes it to every task through host 0's
    store, and the tasks end together once rank 0's has reported): the job's output says once, from rank 0's task,
    where every rank was, rank 1's collective and file:line included, though rank 1's task is on another host with no
    run folder in common.
    Under Slurm, which signals every process of a cancelled job at once, `run` asks the ranks before cancelling."""
    run_id = f"t{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "rank1.stuck"
    where = (["launcher=slurm", "topology=2x1", f"launcher.slurm.partition={testbed.partition}"] if launcher == "slurm"
             else [*bed_hosts(testbed, [1, 1]), *mpi_options(testbed), "launcher.tasks=per_device"])
    with running(*where, "init.timeout_s=300", "launcher.grace_s=2", *_hang_rank_1(marker), run_id=run_id,
                 cwd=tmp_path, env=testbed.env(), merged=True) as proc:
        wait_until(marker.exists, 120, "rank 1 stuck", alive=[proc])
        proc.send_signal(signal.SIGTERM)
        ((code, said),) = finish([proc], timeout=90)
    assert code == 143, said
    if launcher == "slurm":
        found = re.findall(r"where the ranks are: (.*)", said)
        assert "SIGTERM: cancelling Slurm job" in said, said
    else:
        found = re.findall(r"SIGTERM: rank\(s\) 0 still running launcher.grace_s=2 s after it; killing them: (.*)", said)
        assert re.search(seen("stop on host 1"), said), said
    assert len(found) == 1 and re.match(WHERE, found[0]), said
    nothing_left(run_id)


@pytest.mark.docs
def test_the_readme_quotes_what_these_tests_see():
    """docs/across-hosts.md shows real output of these tests: each quoted line is one they assert."""
    check_readme_quotes("A job across hosts", SAID, "tests/e2e/test_job_across_hosts.py")
