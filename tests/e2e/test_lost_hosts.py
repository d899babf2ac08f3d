"""A job that outlives its hosts (topology.min_nodes, topology.spares) under launcher=ssh, on a bed of this module's
own: four namespace hosts, each with its own sshd and a job folder of its own (no shared file system), whose links these
tests take down (the shared bed's carry Slurm and other tests). The cheapest job that shows each fault
(tests/lost_hosts.py: tests/workloads/elastic.py, a tiny weight, one all-reduce a step, a checkpoint every 10 steps) on
three hosts of one process: a host's processes killed, a host's link taken down (no FIN, only silence), host 0 killed, a
spare taking a lost host's place, a host whose link comes back (taken back at the next checkpoint), a preempted host,
and too few hosts left. Each must end as it says (every step trained, or failed with the cause), membership.jsonl must
say what happened, the next attempt must resume from exactly the newest complete copy the hosts that went on held, rank
0's steps must be one lineage, and nothing of the job may be left on any host. And the same job at any world size (the
digits recipe): a job shrunk from 3 hosts to 2 (64 over 3, then over 2) that ends with the weights of a job of the 2
hosts started from the checkpoint the shrunk one resumed from (hosts of unequal sizes over ssh: tests/e2e/test_ssh.py;
the default job on 2+2+1 processes: tests/e2e/test_lost_nodes_slurm.py, and locally at every world size:
tests/e2e/test_any_world_size.py)."""

from __future__ import annotations

import json
import re
import shutil
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from lost_hosts import (LEFT_ON_HOSTS_S, STEPS, data_link, done_on, elastic_recipe, link, membership, newest,
                        one_lineage, resumed_as_it_must, the_change)
from runner.training.copies import complete_copy
from runs import RUN, Started, check_readme_quotes, finish, nothing_left, seen_in, started, wait_until
from test_ssh import Job, job_in, job_processes, kill_host, kill_hosts
from testbed_fixtures import Bed, bed_of_its_own

pytestmark = pytest.mark.timeout(300)

EPOCHS = 12  # the shrink comparison (digits): a checkpoint every 5 epochs, a fault after the first leaves 7 epochs
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
    "back": r"ssh: {host2} ready: the job takes it in at the next checkpoint \(every rank is asked to stop there\)",
    "grown": r"ssh: restarting on 3 host\(s\) \({host0}, {host1}, {host2}\) from the last checkpoint: attempt 3 of 4 "
             r"\(launcher\.max_restarts=3\), {host2} taken in",
    "hung": r"ssh: host 2 \({host2}\) is left out: host 2 \({host2}\) hung the job in attempts 1 and 2: its ranks "
            r"never entered the collective the other hosts' ranks waited in \(all_reduce #\d+, stall; then all_reduce "
            r"#\d+, stall\); the others go on without it",
    "spare late": r"ssh: spare 0 \({host3}\) not ready: ssh could not log in \(exit 255\): .*; tried again every 1 s "
                  r"\(launcher\.ssh\.rejoin_s\) while the job runs",
}


def seen(key: str, bed: Bed | None = None) -> str:
    return seen_in(SAID, key, bed)


@pytest.fixture(scope="module")
def bed(tmp_path_factory) -> Iterator[Bed]:
    with bed_of_its_own(tmp_path_factory.mktemp("lost-hosts-bed"), "--hosts", "4", "--sshd", "--data-network", "--prefix",
                        f"lh{uuid.uuid4().hex[:2]}", sshd=True) as made:
        yield made


@pytest.fixture
def job(bed, tmp_path) -> Iterator[Job]:
    found = job_in(bed, tmp_path)
    for folder in found.views.values():
        (folder / "out").mkdir()  # rank 0's steps.jsonl, on whichever host rank 0 is
    yield found
    for folder in found.views.values():
        shutil.rmtree(folder, ignore_errors=True)


def hosts(names: list[str]) -> str:
    return "topology.hosts=[" + ",".join(f"{{name: {n}, devices: 1}}" for n in names) + "]"


def spares(names: list[str]) -> str:
    return "topology.spares=[" + ",".join(f"{{name: {n}, devices: 1}}" for n in names) + "]"


def start(bed: Bed, job: Job, args: list[str], run_id: str, recipe: list[str] | None = None,
          rejoin_s: int = 0) -> Started:
    """`run` in the root namespace (a machine that is none of the hosts: it outlives them all). ``rejoin_s``: how
    often it tries a lost host (0, unless a test says: a host whose processes were killed still answers, and would
    be taken back)."""
    argv = [RUN, "launcher=ssh", f"launcher.ssh.config_file={bed.ssh_config}", "init=tcp", "topology=custom",
            *(elastic_recipe(job.path / "out") if recipe is None else recipe), "launcher.max_restarts=3",
            "launcher.grace_s=2", f"launcher.ssh.rejoin_s={rejoin_s}", *args, f"run_id={run_id}"]
    return started(argv, cwd=job.views[None], env=bed.env(), run_id=run_id, merged=True)


def checkpoint_on(job: Job, host: str, run_id: str) -> Path:
    return job.run_folder(host, run_id) / "checkpoints" / "last.pt"


def copied(job: Job, run_id: str, names: list[str], proc: Started) -> None:
    """Wait until each of ``names`` holds a complete copy of the first save (or a later one)."""
    def held() -> bool:
        return all(complete_copy(checkpoint_on(job, h, run_id)) is not None for h in names)

    wait_until(held, 150, f"the first save on {names}", alive=[proc])


def lineage(job: Job, bed: Bed, finished: bool = True) -> list[dict]:
    return one_lineage([job.views[h] / "out" / "steps.jsonl" for h in bed.names], finished)


def grew(job: Job, bed: Bed, run_id: str, code: int, said: str, world_size: int, steps: int
         ) -> tuple[list[dict], list[tuple[int, int]]]:
    """A job that grew back finished every step at ``world_size``: its membership changes, and each (attempt, world
    size) rank 0 trained at, in order, its steps one lineage."""
    folder = job.run_folder(None, run_id)
    done_on(folder, said, code, world_size=world_size, steps=steps)
    trained = one_lineage([job.views[h] / "out" / "steps.jsonl" for h in bed.names], steps=steps)
    return membership(folder), sorted({(line["attempt"], line["world"]) for line in trained})


def summary(job: Job, run_id: str) -> dict:
    return json.loads((job.run_folder(None, run_id) / "run_summary.json").read_text())


# --------------------------------------------------------------------------- the faults


def test_a_killed_host_leaves_the_job_to_finish_on_the_others(bed, job):
    a, b, c, _ = bed.names
    run_id = f"k{uuid.uuid4().hex[:8]}"
    with start(bed, job, [hosts([a, b, c]), "topology.min_nodes=2"], run_id) as proc:
        copied(job, run_id, [a, b, c], proc)
        assert kill_host(bed, c, run_id) >= 3
        kept = newest(checkpoint_on(job, h, run_id) for h in (a, b))
        ((code, said),) = finish([proc], timeout=240)
    found = done_on(job.run_folder(None, run_id), said, code, world_size=2)
    change = the_change(job.run_folder(None, run_id), [a, b, c], [a, b], [c])
    assert re.match(rf"{c}: ssh exited 255 \((Connection to {c} closed by remote host\.|client_loop: send "
                    r"disconnect: Broken pipe)\)", change["cause"]), change  # (whichever the ssh client saw first)
    resumed_as_it_must(change, said, kept, a)
    for key in ("lost", "restarting", "ready again", "hosts line"):
        assert re.search(seen(key, bed), said), (key, said)
    assert len(found["membership"]) == 1 and found["membership"][0].startswith(f"{c} lost in attempt 1 ("), found
    lineage(job, bed)
    nothing_left(run_id, LEFT_ON_HOSTS_S)


def test_a_host_whose_link_goes_down_is_found_by_silence_and_the_job_goes_on(bed, job):
    """Host 1's link taken down: its packets dropped, no connection closed; ssh's keepalives (launcher.ssh.keepalive_s
    =1: lost after 3 s) find it, the others' ranks waiting in an all-reduce are stopped, and the job restarts on two
    hosts; once the link is back, host 1's own share has stopped by itself (it heard no beat)."""
    a, b, c, _ = bed.names
    run_id = f"l{uuid.uuid4().hex[:8]}"
    try:
        with start(bed, job, [hosts([a, b, c]), "topology.min_nodes=2", "launcher.ssh.keepalive_s=1"], run_id) as proc:
            copied(job, run_id, [a, b, c], proc)
            link(bed, b, up=False)
            kept = newest(checkpoint_on(job, h, run_id) for h in (a, c))
            ((code, said),) = finish([proc], timeout=240)
    finally:
        link(bed, b, up=True)
    done_on(job.run_folder(None, run_id), said, code, world_size=2)
    change = the_change(job.run_folder(None, run_id), [a, b, c], [a, c], [b])
    assert "not responding" in change["cause"], change
    resumed_as_it_must(change, said, kept, a)
    lineage(job, bed)
    nothing_left(run_id, LEFT_ON_HOSTS_S)


def test_losing_host_0_makes_the_next_host_host_0_and_its_copy_of_the_checkpoint_the_one_resumed(bed, job):
    a, b, c, _ = bed.names
    run_id = f"z{uuid.uuid4().hex[:8]}"
    with start(bed, job, [hosts([a, b, c]), "topology.min_nodes=2"], run_id) as proc:
        copied(job, run_id, [a, b, c], proc)
        assert kill_host(bed, a, run_id) >= 3
        kept = newest(checkpoint_on(job, h, run_id) for h in (b, c))
        ((code, said),) = finish([proc], timeout=240)
    done_on(job.run_folder(None, run_id), said, code, world_size=2)
    change = the_change(job.run_folder(None, run_id), [a, b, c], [b, c], [a])
    # host 1 (the next host 0) resumed from its own copy, the newest it held when host 0 was lost: no step went back
    resumed_as_it_must(change, said, kept, b)
    lineage(job, bed)
    nothing_left(run_id, LEFT_ON_HOSTS_S)


def test_a_spare_takes_the_lost_hosts_place_and_the_world_size_stays(bed, job):
    a, b, c, d = bed.names
    run_id = f"s{uuid.uuid4().hex[:8]}"
    with start(bed, job, [hosts([a, b, c]), spares([d])], run_id) as proc:
        copied(job, run_id, [a, b, c], proc)
        assert kill_host(bed, b, run_id) >= 3
        kept = newest(checkpoint_on(job, h, run_id) for h in (a, c))
        ((code, said),) = finish([proc], timeout=240)
    found = done_on(job.run_folder(None, run_id), said, code, world_size=3)
    (change,) = membership(job.run_folder(None, run_id))
    assert (change["lost"], change["after"], change["spares"]) == ([b], [a, c, d], [d]), change
    assert change["world_size_after"] == change["world_size_before"] == 3
    resumed_as_it_must(change, said, kept, a)
    assert f"spare {d}" in found["membership"][0], found
    assert re.search(seen("spare", bed), said), said
    assert (job.run_folder(d, run_id) / "logs" / "rank00002.log").exists()  # the spare ran rank 2
    lineage(job, bed)
    nothing_left(run_id, LEFT_ON_HOSTS_S)


def test_a_host_whose_link_comes_back_joins_at_the_next_checkpoint_and_the_job_ends_at_its_size(bed, job):
    """Host 2's link down until the launch has lost it (the job goes on on two), then up again: the launching `run`
    tries it every launcher.ssh.rejoin_s and takes it back at the next checkpoint: every rank stops there, the next
    attempt runs on the three hosts from that checkpoint (no step lost), and the job ends at world size 3. Host 2's
    `run` of the first attempt, which heard no beat meanwhile, had stopped its share by itself."""
    a, b, c, _ = bed.names
    run_id, steps = f"f{uuid.uuid4().hex[:8]}", 2 * STEPS  # time enough for host 2 to come back before the end
    args = [hosts([a, b, c]), "topology.min_nodes=2", "launcher.ssh.keepalive_s=1"]
    try:
        with start(bed, job, args, run_id, recipe=elastic_recipe(job.path / "out", steps), rejoin_s=1) as proc:
            copied(job, run_id, [a, b, c], proc)
            link(bed, c, up=False)
            wait_until(lambda: proc.said("restarting on 2 host(s)"), 60, "the job going on without host 2",
                       alive=[proc])
            link(bed, c, up=True)
            ((code, said),) = finish([proc], timeout=240)
    finally:
        link(bed, c, up=True)
    (lost, joined), worlds = grew(job, bed, run_id, code, said, 3, steps)
    assert re.search(seen("back", bed), said) and re.search(seen("grown", bed), said), said
    assert (lost["before"], lost["after"], lost["lost"], lost["joined"]) == ([a, b, c], [a, b], [c], []), lost
    assert (joined["attempt"], joined["next_attempt"], joined["before"], joined["after"], joined["lost"],
            joined["joined"]) == (1, 2, [a, b], [a, b, c], [], [c]), joined
    assert (joined["world_size_before"], joined["world_size_after"], joined["steps_lost"]) == (2, 3, 0), joined
    assert joined["to_first_step_s"] > 0 and joined["cause"] == f"{c}: answered again (launcher.ssh.rejoin_s)"
    assert worlds == [(0, 3), (1, 2), (2, 3)], worlds  # the world size over time: 3, 2, then 3 again
    nothing_left(run_id, LEFT_ON_HOSTS_S)


def test_a_host_that_flaps_is_taken_back_at_most_once_per_rejoin_after_s(bed, job):
    """Host 2's link down until it is lost, then up: taken back at the next checkpoint; once the grown attempt trains,
    down and up again: lost again, and not taken back a second time within launcher.rejoin_after_s (600 s here): the
    job finishes on two, having restarted three times for a host that came and went twice."""
    a, b, c, _ = bed.names
    run_id, steps = f"p{uuid.uuid4().hex[:8]}", 6 * STEPS  # time for two flaps before the end
    args = [hosts([a, b, c]), "topology.min_nodes=2", "launcher.ssh.keepalive_s=1", "launcher.rejoin_after_s=600"]
    trained_at = job.views[a] / "out" / "steps.jsonl"  # host 0 stays host 0: rank 0's steps are there

    def training(attempt: int, world: int) -> bool:
        """Rank 0 took a step of attempt ``attempt`` or a later one at world size ``world``, lately."""
        last = trained_at.read_text().splitlines()[-5:] if trained_at.exists() else []
        # its words looked for, not parsed: the last line may be being written
        return any(f'"world": {world}, "attempt": {a},' in line for line in last for a in range(attempt, attempt + 3))

    try:
        with start(bed, job, args, run_id, recipe=elastic_recipe(job.path / "out", steps), rejoin_s=1) as proc:
            copied(job, run_id, [a, b, c], proc)
            for flap in (1, 2):
                link(bed, c, up=False)
                wait_until(lambda: training(2 * flap - 1, 2), 90, f"training on two after flap {flap}", alive=[proc])
                link(bed, c, up=True)
                if flap == 1:
                    wait_until(lambda: training(2, 3), 90, "training on three again", alive=[proc])
            ((code, said),) = finish([proc], timeout=240)
    finally:
        link(bed, c, up=True)
    changes, worlds = grew(job, bed, run_id, code, said, 2, steps)
    assert [(ch["lost"], ch["joined"]) for ch in changes] == [([c], []), ([], [c]), ([c], [])], changes
    assert said.count(f"ssh: {c} ready: the job takes it in") == 1, said
    assert worlds == [(0, 3), (1, 2), (2, 3), (3, 2)], worlds
    nothing_left(run_id, LEFT_ON_HOSTS_S)


def test_a_spare_started_late_joins_up_to_max_nodes_at_the_next_checkpoint(bed, job):
    """Spare d's machine not up when the job starts (its link down): the job starts on a, b and c and says d is not
    ready; once d answers it is taken in at the next checkpoint, up to topology.max_nodes=4, and the job ends at world
    size 4, no step lost."""
    a, b, c, d = bed.names
    run_id, steps = f"s{uuid.uuid4().hex[:8]}", 2 * STEPS
    args = [hosts([a, b, c]), spares([d]), "topology.min_nodes=2", "topology.max_nodes=4",
            "launcher.ssh.connect_timeout_s=2"]
    try:
        link(bed, d, up=False)
        with start(bed, job, args, run_id, recipe=elastic_recipe(job.path / "out", steps), rejoin_s=1) as proc:
            copied(job, run_id, [a, b, c], proc)
            link(bed, d, up=True)
            ((code, said),) = finish([proc], timeout=240)
    finally:
        link(bed, d, up=True)
    (joined,), worlds = grew(job, bed, run_id, code, said, 4, steps)
    assert re.search(seen("spare late", bed), said), said
    assert (joined["before"], joined["after"], joined["lost"], joined["joined"], joined["steps_lost"]) == (
        [a, b, c], [a, b, c, d], [], [d], 0), joined
    assert joined["cause"] == f"{d}: ready, a spare not ready at the start (launcher.ssh.rejoin_s)", joined
    assert worlds == [(0, 3), (1, 4)], worlds
    nothing_left(run_id, LEFT_ON_HOSTS_S)


def test_fewer_hosts_left_than_min_nodes_ends_the_job_with_that_cause(bed, job):
    a, b, c, _ = bed.names
    run_id = f"m{uuid.uuid4().hex[:8]}"
    with start(bed, job, [hosts([a, b, c]), "topology.min_nodes=2"], run_id) as proc:
        copied(job, run_id, [a, b, c], proc)
        assert kill_hosts(bed, [b, c], run_id) >= 6
        ((code, said),) = finish([proc], timeout=240)
    assert code == 1, said
    assert "fewer than topology.min_nodes=2" in summary(job, run_id)["first_failure"]["exception"], said
    assert re.search(seen("too few", bed), said), said
    (change,) = membership(job.run_folder(None, run_id))
    assert (change["next_attempt"], change["after"], sorted(change["lost"])) == (None, [], sorted([b, c])), change
    lineage(job, bed, finished=False)
    nothing_left(run_id, LEFT_ON_HOSTS_S)


def test_a_preempted_host_leaves_and_the_others_go_on_from_the_checkpoint_its_stop_saved(bed, job):
    """SIGTERM to host 2's own `run` (a spot machine taken back; not the launching `run`'s): it tells the launching
    `run` that it leaves, every rank checkpoints on the stop request and returns, and the job goes on on hosts 0 and 1
    from that checkpoint, no step lost."""
    a, b, c, _ = bed.names
    run_id = f"t{uuid.uuid4().hex[:8]}"
    with start(bed, job, [hosts([a, b, c]), "topology.min_nodes=2"], run_id) as proc:
        copied(job, run_id, [a, b, c], proc)
        _, processes = job_processes(bed, c, run_id)
        shares = [p for p in processes if "--ssh-host" in p.cmdline()]
        (share,) = [p for p in shares if p.parent() not in shares]  # host 2's `run` (not a child forked from it)
        share.send_signal(signal.SIGTERM)
        ((code, said),) = finish([proc], timeout=240)
    found = done_on(job.run_folder(None, run_id), said, code, world_size=2)
    change = the_change(job.run_folder(None, run_id), [a, b, c], [a, b], [c])
    assert change["cause"] == f"{c}: it left: SIGTERM to its `run`", change
    stopped_at = int(re.search(r"stop requested: checkpoint at step (\d+)", said)[1])
    assert change["resumed_from"] == stopped_at and change["steps_lost"] == 0, change
    assert re.search(rf"ssh: host 2 \({c}\) left the job \(SIGTERM to its `run`: a preempted machine\)", said), said
    assert found["membership"][0].startswith(f"{c} lost in attempt 1 ({c}: it left: SIGTERM to its `run`)"), found
    lineage(job, bed)
    nothing_left(run_id, LEFT_ON_HOSTS_S)


def test_a_host_whose_data_network_is_down_is_named_before_the_first_step_and_the_job_goes_on(bed, job):
    """Host 1's data interface (the one gloo is given: backend.socket_ifname=data0) down from the start, its ssh and
    its `run` answering on the lan: the data-network check before attempt 1 names it (its pairs with host 0 and host 2
    failed), it tells the launching `run` that it leaves, and hosts 0 and 2 train from step 0 at world size 2 to the
    end; membership.jsonl says why, and no attempt waits in a collective."""
    a, b, c, _ = bed.names
    run_id = f"n{uuid.uuid4().hex[:8]}"
    data_link(bed, b, up=False)
    try:
        with start(bed, job, [hosts([a, b, c]), "topology.min_nodes=2", "backend.socket_ifname=data0"],
                   run_id) as proc:
            ((code, said),) = finish([proc], timeout=240)
    finally:
        data_link(bed, b, up=True)
    done_on(job.run_folder(None, run_id), said, code, world_size=2)
    named = f"host 1 ({b}) failed the data-network check before attempt 1 (2 of the failed pair(s): host 0 ({a}) and"
    assert f"ssh: host 1 ({b}) is left out: {named}" in said, said[-3000:]
    change = the_change(job.run_folder(None, run_id), [a, b, c], [a, c], [b])
    assert change["cause"].startswith(f"{b}: left out: {named}"), change
    assert [(line["attempt"], line["world"]) for line in lineage(job, bed)][:1] == [(1, 2)]
    assert "Traceback" not in said and "stall" not in said, said[-3000:]
    nothing_left(run_id, LEFT_ON_HOSTS_S)


def test_a_host_that_hangs_the_job_in_two_attempts_in_a_row_is_named_and_left_out(bed, job):
    """Host 2's rank stops after 15 steps of every attempt (a wedged GPU: it never enters the next all-reduce) while
    its `run` and its network answer: the stall watch ends attempts 1 and 2 (launcher.stall_timeout_s=5), each
    diagnosed with host 2's rank behind and the others waiting; before attempt 3 host 0's agent names host 2 (the
    same host behind in two attempts in a row), it leaves, and hosts 0 and 1 finish from the last checkpoint at world
    size 2. membership.jsonl and logs/hangs.jsonl say why."""
    a, b, c, _ = bed.names
    run_id = f"g{uuid.uuid4().hex[:8]}"
    recipe = [*elastic_recipe(job.path / "out"), f"+recipe.wedge_host={c}", "+recipe.wedge_after=15"]
    with start(bed, job, [hosts([a, b, c]), "topology.min_nodes=2", "launcher.stall_timeout_s=5"], run_id,
               recipe=recipe) as proc:
        ((code, said),) = finish([proc], timeout=240)
    folder = job.run_folder(None, run_id)
    done_on(folder, said, code, world_size=2)
    named = (f"host 2 ({c}) hung the job in attempts 1 and 2: its ranks never entered the collective the other "
             f"hosts' ranks waited in (all_reduce #")
    assert re.search(seen("hung", bed), said), said[-3000:]
    assert said.count(f"[host {a}] StallError: stall: no rank completed a collective or a progress step for 5 s") == 2
    hung = [json.loads(line) for line in (job.run_folder(a, run_id) / "logs" / "hangs.jsonl").read_text().splitlines()]
    assert [(h["attempt"], h["kind"], h["behind"], h["waiting"]) for h in hung] == [
        (0, "stall", [c], [a, b]), (1, "stall", [c], [a, b])], hung
    (change,) = membership(folder)
    assert (change["before"], change["after"], change["lost"], change["world_size_after"]) == (
        [a, b, c], [a, b], [c], 2), change
    assert change["cause"].startswith(f"{c}: left out: {named}"), change
    trained = lineage(job, bed)
    worlds = sorted({(line["attempt"], line["world"]) for line in trained})
    assert [w for _, w in worlds] == [3, 3, 2] and worlds[:2] == [(0, 3), (1, 3)], worlds  # then, on two, to the end
    assert {line["resumed"] for line in trained if line["attempt"] == 1} == {10}  # attempt 2 from its checkpoint
    nothing_left(run_id, LEFT_ON_HOSTS_S)


# --------------------------------------------------------------------------- any world size




def test_a_job_shrunk_from_3_hosts_to_2_trains_as_a_job_on_2_from_its_checkpoint(bed, job):
    """64 over 3 processes (22, 21, 21) until host 2 is killed after the first checkpoint, then 64 over 2 (32, 32)
    from it: the global batch is kept, so the final weights are those of a job of the other 2 hosts started from that
    checkpoint (recipe.resume), within TOLERANCE."""
    a, b, c, _ = bed.names
    run_id, on_two = f"w{uuid.uuid4().hex[:8]}", f"v{uuid.uuid4().hex[:8]}"
    kept = job.views[a] / "shrunk-from.pt"  # the checkpoint the shrunk job resumes from, kept on host 0
    digits = [f"recipe.epochs={EPOCHS}", "recipe.global_batch_size=64"]
    with start(bed, job, [hosts([a, b, c]), "topology.min_nodes=2"], run_id, recipe=digits) as proc:
        wait_until(lambda: checkpoint_on(job, a, run_id).exists(), 150, "host 0's first checkpoint", alive=[proc])
        shutil.copy(checkpoint_on(job, a, run_id), kept)  # (saved whole: replaced atomically)
        assert kill_host(bed, c, run_id) >= 3
        ((code, said),) = finish([proc], timeout=240)
    assert code == 0 and summary(job, run_id)["world_size"] == 2, said
    assert "global batch 64 (22/21 per process)" in said and "global batch 64 (32 per process)" in said, said
    (change,) = membership(job.run_folder(None, run_id))
    step = torch.load(kept, weights_only=True)["step"]
    assert change["resumed_from"] == step > 0, change
    with start(bed, job, [hosts([a, b]), f"recipe.resume={job.path / kept.name}"], on_two,
               recipe=digits) as proc:
        ((code, again),) = finish([proc], timeout=240)
    assert code == 0, again
    assert f"resumed from {job.path / kept.name}: step {step}," in again, again
    shrunk, fresh = (torch.load(checkpoint_on(job, a, r), weights_only=True) for r in (run_id, on_two))
    assert shrunk["step"] == fresh["step"] == 21 * EPOCHS
    assert max(float((shrunk["model"][k] - fresh["model"][k]).abs().max()) for k in fresh["model"]) < TOLERANCE
    nothing_left(run_id, LEFT_ON_HOSTS_S)


@pytest.mark.docs
def test_the_readme_quotes_what_these_tests_see():
    """docs/lost-hosts.md shows real output of these tests: each quoted line is one they assert."""
    check_readme_quotes("When a host is lost", SAID, "tests/e2e/test_lost_hosts.py")
