"""A job that outlives its hosts (topology.min_nodes, topology.spares) under launcher=ssh, on a bed of this module's
own: four namespace hosts, each with its own sshd and a job folder of its own (no shared file system), whose links
these tests take down (the shared bed's carry Slurm and other tests). The bundled digits recipe on three hosts of one
process: a host's processes killed, a host's link taken down (no FIN, only silence), host 0 killed, a spare taking
a lost host's place, a host that flaps (lost, then back), and too few hosts left. Each must end as it says (the
training done with its accuracy, or failed with the cause), membership.jsonl must say what happened, the checkpoint
step must never go back, and nothing of the job may be left on any host. And the same job at any world size: the
default job on 2+2+1 processes, and a job shrunk from 3 hosts to 2 (64 over 3, then over 2) that ends with the
weights of a job of the 2 hosts started from the checkpoint the shrunk one resumed from."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from runner.training.copies import complete_copy
from runs import RUN, Started, check_readme_quotes, finish, processes_of, seen_in, started, wait_until
from test_ssh import Job, job_in, job_processes, kill_host, kill_hosts
from testbed_fixtures import Bed, bed_of_its_own

pytestmark = pytest.mark.timeout(300)

EPOCHS = 12  # the digits recipe saves every 5 epochs: a fault after the first checkpoint leaves 7 epochs to
# the next attempt
BATCH = 48  # docs/lost-hosts.md's quotes of these runs were taken with it (any batch of 3 or more runs: 64 below)
TOLERANCE = 1e-5  # weights of two jobs that trained the same global batches (tests/e2e/test_any_world_size.py)


# What `run` shows, as patterns of the bed's host names: docs/lost-hosts.md quotes these lines
# (test_the_readme_quotes_what_these_tests_see checks it)
SAID = {
    "lost": r"ssh: host 2 \({host2}\) lost: ssh exited 255 \(Connection to {host2} closed by remote host\.\): the host, "
            r"its network or its `run` is gone",
    "restarting": r"ssh: restarting on 2 host\(s\) \({host0}, {host1}\) from the last checkpoint: attempt 2 of 4 "
                  r"\(launcher\.max_restarts=3\)",
    "ready again": r"ssh: 2 host\(s\) ready \(runner \S+, torch \S+\) in \d+\.\d s: {host0}, {host1}; each reaches host "
                   r"0's rendezvous at {host0} port \d+",
    "hosts line": r"  hosts     {host2} lost in attempt 1 \({host2}: ssh exited 255",
    "spare": r"ssh: restarting on 3 host\(s\) \({host0}, {host2}, {host3}\) from the last checkpoint: attempt 2 of 4 "
             r"\(launcher\.max_restarts=3\), spare\(s\) {host3} in the lost host's place",
    "too few": r"ssh: the job ends: 1 host\(s\) left of 3, fewer than topology\.min_nodes=2 \(no spare left\)",
}


def seen(key: str, bed: Bed | None = None) -> str:
    return seen_in(SAID, key, bed)


@pytest.fixture(scope="module")
def bed(tmp_path_factory) -> Iterator[Bed]:
    with bed_of_its_own(tmp_path_factory.mktemp("lost-hosts-bed"), "--hosts", "4", "--sshd", "--prefix",
                        f"lh{uuid.uuid4().hex[:2]}", sshd=True) as made:
        yield made


@pytest.fixture
def job(bed, tmp_path) -> Iterator[Job]:
    found = job_in(bed, tmp_path)
    yield found
    for folder in found.views.values():
        shutil.rmtree(folder, ignore_errors=True)


def hosts(names: list[str]) -> str:
    return "topology.hosts=[" + ",".join(f"{{name: {n}, devices: 1}}" for n in names) + "]"


def spares(names: list[str]) -> str:
    return "topology.spares=[" + ",".join(f"{{name: {n}, devices: 1}}" for n in names) + "]"


def start(bed: Bed, job: Job, args: list[str], run_id: str, batch: int = BATCH) -> Started:
    """`run` in the root namespace (a machine that is none of the hosts: it outlives them all)."""
    argv = [RUN, "launcher=ssh", f"launcher.ssh.config_file={bed.ssh_config}", "init=tcp", "topology=custom",
            f"recipe.epochs={EPOCHS}", f"recipe.global_batch_size={batch}", "launcher.max_restarts=3",
            "launcher.grace_s=2", *args, f"run_id={run_id}"]
    return started(argv, cwd=job.views[None], env=bed.env(), run_id=run_id, merged=True)


def checkpoint_on(job: Job, host: str, run_id: str) -> Path:
    return job.run_folder(host, run_id) / "checkpoints" / "last.pt"


def link(bed: Bed, host: str, up: bool) -> None:
    """``host``'s link to the others up or down (down: its packets are dropped, no connection is closed)."""
    h = bed.host(host)
    subprocess.run(bed.exec_argv(h, ["ip", "link", "set", h.ifname, "up" if up else "down"]), check=True)


def membership(job: Job, run_id: str) -> list[dict]:
    path = job.run_folder(None, run_id) / "membership.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def summary(job: Job, run_id: str) -> dict:
    return json.loads((job.run_folder(None, run_id) / "run_summary.json").read_text())


def done_on(job: Job, run_id: str, said: str, code: int, hosts_after: int) -> dict:
    """The job finished: exit 0, `done`, a final accuracy, on ``hosts_after`` hosts of one process."""
    assert code == 0, said
    found = summary(job, run_id)
    assert found["status_text"] == "done: every rank returned (exit 0)", found  # the last round's records came back
    assert found["world_size"] == hosts_after, found
    final = int(re.search(r"final test accuracy: \S+ after (\d+) steps", said)[1])
    assert found["metrics_step"] == found["final_metrics"]["steps"] == final, found  # the last round's metrics
    assert found["final_metrics"]["test_accuracy"] > 0.8, found
    assert re.search(r"final test accuracy: 0\.\d+ after \d+ steps", said), said
    return found


def resumed_steps(said: str) -> list[int]:
    return [int(s) for s in re.findall(r"resumed from \S+: step (\d+),", said)]


def nothing_left(run_id: str) -> None:
    wait_until(lambda: not processes_of(run_id), 30, "nothing of the job left on any host")


def fault_after_a_checkpoint(bed: Bed, job: Job, run_id: str, proc: Started, host0: str) -> None:
    wait_until(lambda: checkpoint_on(job, host0, run_id).exists(), 150, "host 0's first checkpoint", alive=[proc])


# --------------------------------------------------------------------------- the faults


def test_a_killed_host_leaves_the_job_to_finish_on_the_others(bed, job):
    a, b, c, _ = bed.names
    run_id = f"k{uuid.uuid4().hex[:8]}"
    with start(bed, job, [hosts([a, b, c]), "topology.min_nodes=2"], run_id) as proc:
        fault_after_a_checkpoint(bed, job, run_id, proc, a)
        assert kill_host(bed, c, run_id) >= 3
        ((code, said),) = finish([proc], timeout=240)
    found = done_on(job, run_id, said, code, hosts_after=2)
    (change,) = membership(job, run_id)
    assert (change["attempt"], change["next_attempt"], change["before"], change["after"], change["lost"]) == (
        0, 1, [a, b, c], [a, b], [c]), change
    assert change["cause"].startswith(f"{c}: ssh exited 255 (Connection to {c} closed by remote host.)"), change
    assert (change["world_size_before"], change["world_size_after"]) == (3, 2)
    assert change["resumed_from"] > 0 and change["steps_lost"] >= 0 and change["to_first_step_s"] > 0, change
    assert resumed_steps(said) == [change["resumed_from"]], said
    for key in ("lost", "restarting", "ready again", "hosts line"):
        assert re.search(seen(key, bed), said), (key, said)
    assert len(found["membership"]) == 1 and found["membership"][0].startswith(f"{c} lost in attempt 1 ("), found
    nothing_left(run_id)


def test_a_host_whose_link_goes_down_is_found_by_silence_and_the_job_goes_on(bed, job):
    """Host 1's link taken down: its packets dropped, no connection closed; ssh's keepalives (launcher.ssh.keepalive_s
    =1: lost after 3 s) find it, the others' ranks waiting in an all-reduce are stopped, and the job restarts on two
    hosts; once the link is back, host 1's own share has stopped by itself (it heard no beat)."""
    a, b, c, _ = bed.names
    run_id = f"l{uuid.uuid4().hex[:8]}"
    try:
        with start(bed, job, [hosts([a, b, c]), "topology.min_nodes=2", "launcher.ssh.keepalive_s=1"], run_id) as proc:
            fault_after_a_checkpoint(bed, job, run_id, proc, a)
            link(bed, b, up=False)
            ((code, said),) = finish([proc], timeout=240)
    finally:
        link(bed, b, up=True)
    done_on(job, run_id, said, code, hosts_after=2)
    (change,) = membership(job, run_id)
    assert (change["lost"], change["after"]) == ([b], [a, c]), change
    assert "not responding" in change["cause"], change
    assert change["to_first_step_s"] < 60, change
    nothing_left(run_id)


def test_losing_host_0_makes_the_next_host_host_0_and_its_copy_of_the_checkpoint_the_one_resumed(bed, job):
    a, b, c, _ = bed.names
    run_id = f"z{uuid.uuid4().hex[:8]}"
    with start(bed, job, [hosts([a, b, c]), "topology.min_nodes=2"], run_id) as proc:
        fault_after_a_checkpoint(bed, job, run_id, proc, a)
        wait_until(lambda: checkpoint_on(job, b, run_id).exists(), 60, "host 1's copy of the checkpoint", alive=[proc])
        copy = complete_copy(checkpoint_on(job, b, run_id))
        assert kill_host(bed, a, run_id) >= 3
        ((code, said),) = finish([proc], timeout=240)
    done_on(job, run_id, said, code, hosts_after=2)
    (change,) = membership(job, run_id)
    assert (change["lost"], change["after"]) == ([a], [b, c]), change
    # host 1 (the next host 0) resumed from its own copy, the one it held when host 0 was lost: no step went back
    assert (change["resumed_from"], change["resumed_from_host"], change["resumed_from_save"]) == (
        copy.step, b, copy.seq), (change, copy)
    nothing_left(run_id)


def test_a_spare_takes_the_lost_hosts_place_and_the_world_size_stays(bed, job):
    a, b, c, d = bed.names
    run_id = f"s{uuid.uuid4().hex[:8]}"
    with start(bed, job, [hosts([a, b, c]), spares([d])], run_id) as proc:
        fault_after_a_checkpoint(bed, job, run_id, proc, a)
        assert kill_host(bed, b, run_id) >= 3
        ((code, said),) = finish([proc], timeout=240)
    found = done_on(job, run_id, said, code, hosts_after=3)
    (change,) = membership(job, run_id)
    assert (change["lost"], change["after"], change["spares"]) == ([b], [a, c, d], [d]), change
    assert change["world_size_after"] == change["world_size_before"] == 3
    assert f"spare {d}" in found["membership"][0], found
    assert re.search(seen("spare", bed), said), said
    assert (job.run_folder(d, run_id) / "logs" / "rank00002.log").exists()  # the spare ran rank 2
    nothing_left(run_id)


def test_a_host_that_flaps_is_lost_once_and_not_taken_back(bed, job):
    """Host 2's link down until the launch has lost it, then up again at once: the job goes on on the other two, and
    host 2's `run`, which heard no beat meanwhile, has stopped its share by itself."""
    a, b, c, _ = bed.names
    run_id = f"f{uuid.uuid4().hex[:8]}"
    try:
        with start(bed, job, [hosts([a, b, c]), "topology.min_nodes=2", "launcher.ssh.keepalive_s=1"], run_id) as proc:
            fault_after_a_checkpoint(bed, job, run_id, proc, a)
            link(bed, c, up=False)
            wait_until(lambda: proc.said(f"host 2 ({c}) lost"), 60, "host 2 lost", alive=[proc])
            link(bed, c, up=True)
            ((code, said),) = finish([proc], timeout=240)
    finally:
        link(bed, c, up=True)
    done_on(job, run_id, said, code, hosts_after=2)
    assert [m["lost"] for m in membership(job, run_id)] == [[c]]
    nothing_left(run_id)


def test_fewer_hosts_left_than_min_nodes_ends_the_job_with_that_cause(bed, job):
    a, b, c, _ = bed.names
    run_id = f"m{uuid.uuid4().hex[:8]}"
    with start(bed, job, [hosts([a, b, c]), "topology.min_nodes=2"], run_id) as proc:
        fault_after_a_checkpoint(bed, job, run_id, proc, a)
        assert kill_hosts(bed, [b, c], run_id) >= 6
        ((code, said),) = finish([proc], timeout=240)
    assert code == 1, said
    assert "fewer than topology.min_nodes=2" in summary(job, run_id)["first_failure"]["exception"], said
    assert re.search(seen("too few", bed), said), said
    (change,) = membership(job, run_id)
    assert (change["next_attempt"], change["after"], sorted(change["lost"])) == (None, [], sorted([b, c])), change
    nothing_left(run_id)


def test_a_preempted_host_leaves_and_the_others_go_on_from_the_checkpoint_its_stop_saved(bed, job):
    """SIGTERM to host 2's own `run` (a spot machine taken back; not the launching `run`'s): it tells the launching
    `run` that it leaves, every rank checkpoints on the stop request and returns, and the job goes on on hosts 0 and 1
    from that checkpoint, no step lost."""
    a, b, c, _ = bed.names
    run_id = f"t{uuid.uuid4().hex[:8]}"
    with start(bed, job, [hosts([a, b, c]), "topology.min_nodes=2"], run_id) as proc:
        fault_after_a_checkpoint(bed, job, run_id, proc, a)
        _, processes = job_processes(bed, c, run_id)
        shares = [p for p in processes if "--ssh-host" in p.cmdline()]
        (share,) = [p for p in shares if p.parent() not in shares]  # host 2's `run` (not a child forked from it)
        share.send_signal(signal.SIGTERM)
        ((code, said),) = finish([proc], timeout=240)
    found = done_on(job, run_id, said, code, hosts_after=2)
    (change,) = membership(job, run_id)
    assert (change["lost"], change["after"]) == ([c], [a, b]), change
    assert change["cause"] == f"{c}: it left: SIGTERM to its `run`", change
    stopped_at = int(re.search(r"stop requested: checkpoint at step (\d+)", said)[1])
    assert change["resumed_from"] == stopped_at and change["steps_lost"] == 0, change
    assert re.search(rf"ssh: host 2 \({c}\) left the job \(SIGTERM to its `run`: a preempted machine\)", said), said
    assert found["membership"][0].startswith(f"{c} lost in attempt 1 ({c}: it left: SIGTERM to its `run`)"), found
    nothing_left(run_id)


# --------------------------------------------------------------------------- any world size


def test_the_default_job_runs_on_2_plus_2_plus_1_processes(bed, job):
    """Five processes on three hosts, as the job's users have them: the default job (digits, 64 over 5: 13, 13, 13,
    13, 12; 2 of its 20 epochs), from a machine that is none of the hosts."""
    a, b, c, _ = bed.names
    run_id = f"p{uuid.uuid4().hex[:8]}"
    listed = "topology.hosts=[" + ",".join(f"{{name: {n}, devices: {d}}}" for n, d in ((a, 2), (b, 2), (c, 1))) + "]"
    argv = [RUN, "launcher=ssh", f"launcher.ssh.config_file={bed.ssh_config}", "init=tcp", "topology=custom", listed,
            "recipe.epochs=2", f"run_id={run_id}"]
    with started(argv, cwd=job.views[None], env=bed.env(), run_id=run_id, merged=True) as proc:
        ((code, said),) = finish([proc], timeout=240)
    assert code == 0, said
    assert "5 process(es), global batch 64 (13/12 per process), 2 epochs" in said, said
    found = summary(job, run_id)
    assert (found["world_size"], found["processes_per_host"], found["metrics_step"]) == (5, [2, 2, 1], 42), found
    assert found["final_metrics"]["test_accuracy"] > 0.85, found
    nothing_left(run_id)


def test_a_job_shrunk_from_3_hosts_to_2_trains_as_a_job_on_2_from_its_checkpoint(bed, job):
    """64 over 3 processes (22, 21, 21) until host 2 is killed after the first checkpoint, then 64 over 2 (32, 32)
    from it: the global batch is kept, so the final weights are those of a job of the other 2 hosts started from that
    checkpoint (recipe.resume), within TOLERANCE."""
    a, b, c, _ = bed.names
    run_id, on_two = f"w{uuid.uuid4().hex[:8]}", f"v{uuid.uuid4().hex[:8]}"
    kept = job.views[a] / "shrunk-from.pt"  # the checkpoint the shrunk job resumes from, kept on host 0
    with start(bed, job, [hosts([a, b, c]), "topology.min_nodes=2"], run_id, batch=64) as proc:
        fault_after_a_checkpoint(bed, job, run_id, proc, a)
        shutil.copy(checkpoint_on(job, a, run_id), kept)  # (saved whole: replaced atomically)
        assert kill_host(bed, c, run_id) >= 3
        ((code, said),) = finish([proc], timeout=240)
    done_on(job, run_id, said, code, hosts_after=2)
    assert "global batch 64 (22/21 per process)" in said and "global batch 64 (32 per process)" in said, said
    (change,) = membership(job, run_id)
    step = torch.load(kept, weights_only=True)["step"]
    assert change["resumed_from"] == step > 0, change
    with start(bed, job, [hosts([a, b]), f"recipe.resume={job.path / kept.name}"], on_two, batch=64) as proc:
        ((code, again),) = finish([proc], timeout=240)
    assert code == 0, again
    assert f"resumed from {job.path / kept.name}: step {step}," in again, again
    shrunk, fresh = (torch.load(checkpoint_on(job, a, r), weights_only=True) for r in (run_id, on_two))
    assert shrunk["step"] == fresh["step"] == 21 * EPOCHS
    assert max(float((shrunk["model"][k] - fresh["model"][k]).abs().max()) for k in fresh["model"]) < TOLERANCE
    nothing_left(run_id)


@pytest.mark.unit
def test_the_readme_quotes_what_these_tests_see():
    """docs/lost-hosts.md shows real output of these tests: each quoted line is one they assert."""
    check_readme_quotes("When a host is lost", SAID, "tests/e2e/test_lost_hosts.py")
