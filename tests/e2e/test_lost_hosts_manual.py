"""A job that outlives its hosts (topology.min_nodes, topology.spares) under launcher=manual, on a bed of this module's
own: four namespace hosts, each `run` started in its host's namespace as a user types it there, each in a job folder of
its own (no shared file system), with no `run` that holds the job: the hosts decide who goes on in etcd
(runner.launchers.elastic.decisions), the job's own (a member started by each host's `run`) or one the test runs.

The cheapest job that shows each fault (tests/workloads/elastic.py: a tiny weight, one all-reduce a step, a checkpoint
every EVERY steps, a step every STEP_S) on three hosts of one process, keepalives every second (a host lost 4 s after
its last): a host's every process killed, a host's link taken down (it ends by itself, not training alone), a host's
link taken down and up again (its `run` stands by and is taken back at the next checkpoint), a rank's own failure (the
same hosts again), host 0 killed (the next host 0 resumes from its own copy), host 0 killed while it sends a copy (its
link slowed: the newest complete copy wins, never an older one), a relaunch after host 0 was lost (the newest copy on
any host, not host 0's stale one), a host's `run` paused longer than every window (the others go on; it is taken back
once it wakes), one host's packets to another dropped one way, an etcd member lost, a preempted host (SIGTERM to its
`run`: it leaves, the others go on from the checkpoint its stop saved), a spare taken in, a lost host's `run` typed
again (it joins at the next checkpoint: the world size returns), too few hosts left, and two hosts with
topology.min_nodes=1 under an etcd of the user's. Each asserts how every host ended, membership.jsonl, the exact step
resumed (that of the newest complete copy the hosts that remain held), that one group trained at a time (the ranks'
steps.jsonl: one lineage), and that nothing is left on any host."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import psutil
import pytest

from runner.launchers.elastic.etcd_member import ETCD
from runner.training.copies import complete_copy
from etcd_fixtures import local_etcd
from lost_hosts import (EVERY, LEFT_ON_HOSTS_S, STEPS, data_cut_between, data_link, done_on, elastic_recipe, link,
                        membership, one_lineage, resumed_steps, the_change)
from runs import (RUN, Started, check_readme_quotes, finish, nothing_left, seen_in, stage_workloads, started,
                  wait_until)
from testbed_fixtures import Bed, bed_of_its_own

pytestmark = pytest.mark.timeout(300)

TTL_S = 4  # launcher.manual.keepalive_s=1: a host's lease outlives its last keepalive by 4 intervals

# What each host's `run` shows, as patterns of the bed's host names: docs/lost-hosts.md quotes these
# lines (test_the_readme_quotes_what_these_tests_see checks it)
SAID = {
    "decision": r"manual: attempt 1 ended; waiting for the decision on the next \(the job's etcd\)",
    "lost": r"manual: host {host2} lost: its lease in the job's etcd expired \(4 s without a keepalive\): its `run`, its "
            r"machine or its network is gone; ending this attempt",
    "decided": r"manual: decided by (?:{host0}|{host1}): attempt 2 on {host0}, {host1}",  # (whichever came first)
    "restarting": r"manual: restarting on 2 host\(s\) \({host0}, {host1}\) from the last checkpoint: attempt 2 of 4 "
                  r"\(launcher\.max_restarts=3\)",
    "hosts line": r"  hosts     {host2} lost in attempt 1 \({host2}: its lease in the job's etcd expired",
    "cut off": r"manual: the job ends on this host: the job's etcd cannot be reached, so this host cannot learn who "
               r"goes on",
    "same hosts": r"restarting: attempt 2 of 4 \(launcher\.max_restarts=3\); every host ended the last one; the recipe "
                  r"resumes from its last checkpoint",
    "left out": r"manual: the other hosts went on without this one \({host0}, {host1}, from attempt 2\): its lease in "
                r"the job's etcd expired \(4 s without a keepalive\): its `run`, its machine or its network is gone; "
                r"this host stands by to be taken back at their next checkpoint",
    "left": r"manual: this host left the job \(SIGTERM: its ranks saved their checkpoint\); the others go on without it",
    "spare": r"manual: restarting on 3 host\(s\) \({host0}, {host1}, {host3}\) from the last checkpoint: attempt 2 of 4 "
             r"\(launcher\.max_restarts=3\), spare\(s\) {host3} in the lost host's place",
    "named": r"manual: this host is left out of the job: host 1 \({host1}\) failed the data-network check before "
             r"attempt 2 \(2 of the failed pair\(s\): host 0 \({host0}\) and host 1 \({host1}\): .+; host 1 \({host1}\) "
             r"and host 2 \({host2}\): .+\); the others go on without it; its `run` typed again \(its data network "
             r"mended\) joins at a checkpoint, checked again",
    "arrives": r"manual: host {host3} arrives \(the spec does not list it\): a client of the job's etcd \(3 members\) "
               r"on port \d+",
    "taken in": r"manual: spare {host3} taken in: attempt 2 on 3 host\(s\) \({host0}, {host1}, {host3}\)",
    "etcd again": r"manual: this host's member of the job's etcd \({host2}, 3 members\) on port \d+, joining the "
                  r"running cluster again: its earlier member removed, this one added",
    "back": r"manual: host {host2} back: waiting in the job's etcd to be taken in at the next checkpoint",
    "ready": r"manual: {host2} ready: the job takes it in at the next checkpoint \(every rank is asked to stop there\)",
    "host taken in": r"manual: host {host2} taken in: attempt 3 on 3 host\(s\) \({host0}, {host1}, {host2}\)",
    "grown": r"manual: restarting on 3 host\(s\) \({host0}, {host1}, {host2}\) from the last checkpoint: attempt 3 of "
             r"4 \(launcher\.max_restarts=3\), {host2} taken in",
}


def seen(key: str, bed: Bed) -> str:
    return seen_in(SAID, key, bed)


@pytest.fixture(scope="module")
def bed(tmp_path_factory) -> Iterator[Bed]:
    with bed_of_its_own(tmp_path_factory.mktemp("lost-hosts-manual-bed"), "--hosts", "4", "--data-network", "--prefix",
                        f"lm{uuid.uuid4().hex[:2]}") as made:
        yield made


@contextmanager
def by_hand(bed: Bed, tmp_path: Path, count: int, args: list[str], run_id: str, spares: int = 0,
            steps: int = STEPS) -> Iterator[list[Started]]:
    """`run ... launcher=manual launcher.manual.host=i run_id=...` in the namespaces of the bed's first ``count``
    hosts (and the ``spares`` after them, which ``args`` name), each in its own folder ``tmp_path/host<i>`` (the tests'
    workloads staged, as a user's checkout there); rank 0's steps go to ``tmp_path/out/steps.jsonl``."""
    (tmp_path / "out").mkdir(exist_ok=True)
    with ExitStack() as stack:
        yield [stack.enter_context(typed_on(bed, tmp_path, count, args, run_id, i, steps))
               for i in range(count + spares)]


def typed_on(bed: Bed, tmp_path: Path, count: int, args: list[str], run_id: str, i: int,
             steps: int = STEPS, as_host: str | None = None) -> Started:
    """:func:`by_hand`'s command on the bed's host ``i``, in its folder (started again there: the same command);
    ``as_host``: its launcher.manual.host (default: ``i``)."""
    listed = "topology.hosts=[" + ",".join(f"{{name: {n}, devices: 1}}" for n in bed.names[:count]) + "]"
    argv = [RUN, "launcher=manual", "init=tcp", "topology=custom", listed, *elastic_recipe(tmp_path / "out", steps),
            "launcher.max_restarts=3", "launcher.grace_s=2", "launcher.manual.keepalive_s=1", *args,
            f"launcher.manual.host={i if as_host is None else as_host}", f"run_id={run_id}"]
    return started(bed.exec_argv(bed.names[i], argv), cwd=stage_workloads(tmp_path / f"host{i}"), env=bed.env(),
                   run_id=run_id, merged=True)


def run_folder(tmp_path: Path, host: int, run_id: str) -> Path:
    return tmp_path / f"host{host}" / "outputs" / "runs" / run_id


def checkpoint(tmp_path: Path, host: int, run_id: str) -> Path:
    return run_folder(tmp_path, host, run_id) / "checkpoints" / "last.pt"


def copied(tmp_path: Path, run_id: str, hosts: range, procs: list[Started], saves: int = 1) -> None:
    """Wait until each of ``hosts`` holds a complete copy of save ``saves`` (or a later one)."""
    def held() -> bool:
        return all((c := complete_copy(checkpoint(tmp_path, h, run_id))) is not None and c.seq >= saves for h in hosts)

    wait_until(held, 150, f"save {saves} on hosts {list(hosts)}", alive=procs)


def kill(proc: Started) -> int:
    """A host's `run` and everything it started killed at once (its etcd member too): the machine gone, as its peers
    see it. How many."""
    root = psutil.Process(proc.proc.pid)
    every = [root, *root.children(recursive=True)]
    for p in every:
        try:
            p.kill()
        except psutil.Error:
            continue
    return len(every)


def tree(proc: Started) -> list[psutil.Process]:
    root = psutil.Process(proc.proc.pid)
    return [root, *root.children(recursive=True)]


def rank_of(proc: Started, deadline_s: float = 60) -> psutil.Process:
    """The one rank of a host's `run`: a child of its zygote (the rounds' zygote: a child of `run`'s launch agent, which
    runs the rounds) that leads a session of its own (the zygote's other child, the agent's client of host 0's store,
    does not)."""
    found: list[psutil.Process] = []

    def look() -> bool:
        try:
            found[:] = [child for zygote in psutil.Process(proc.proc.pid).children(recursive=True)
                        if "runner.worker.zygote" in " ".join(zygote.cmdline())
                        for child in zygote.children() if os.getsid(child.pid) == child.pid]
        except (psutil.Error, ProcessLookupError):
            found.clear()
        return len(found) == 1

    wait_until(look, deadline_s, "the host's one rank", alive=[proc])
    return found[0]


def member_of(proc: Started) -> psutil.Process:
    """The host's member of the job's own etcd: the process of its `run`'s that runs the etcd program (a child of the
    launch agent, which runs the rounds)."""
    (found,) = [p for p in psutil.Process(proc.proc.pid).children(recursive=True) if p.name() == ETCD]
    return found


# --------------------------------------------------------------------------- hosts lost


def test_a_killed_host_leaves_the_job_to_finish_on_the_others(bed, tmp_path):
    a, b, c, _ = bed.names
    run_id = f"k{uuid.uuid4().hex[:8]}"
    with by_hand(bed, tmp_path, 3, ["topology.min_nodes=2"], run_id) as procs:
        copied(tmp_path, run_id, range(3), procs)
        assert kill(procs[2]) >= 4  # its `run`, its etcd member, its zygote, its rank at least
        kept = [complete_copy(checkpoint(tmp_path, h, run_id)) for h in (0, 1)]
        (code0, said0), (code1, said1), _ = finish(procs, timeout=200)
    found = done_on(run_folder(tmp_path, 0, run_id), said0, code0, world_size=2)
    assert code1 == 0, said1
    change = the_change(run_folder(tmp_path, 0, run_id), [a, b, c], [a, b], [c])
    assert (change["world_size_before"], change["world_size_after"]) == (3, 2), change
    newest = max(kept)  # (saves after the kill come later: the attempt ends at once)
    assert (change["resumed_from"], change["resumed_from_host"]) == (newest.step, a), (change, kept)
    assert resumed_steps(said0) == [change["resumed_from"]] and change["to_first_step_s"] > 0, said0
    assert the_change(run_folder(tmp_path, 1, run_id), [a, b, c], [a, b], [c])  # every host keeps the record
    for key in ("decision", "lost", "decided", "restarting", "hosts line"):
        assert re.search(seen(key, bed), said0), (key, said0)
    assert len(found["membership"]) == 1 and found["membership"][0].startswith(f"{c} lost in attempt 1 ("), found
    one_lineage([tmp_path / 'out' / 'steps.jsonl'])
    nothing_left(run_id, LEFT_ON_HOSTS_S)


def test_a_host_whose_link_goes_down_is_lost_and_ends_by_itself_without_training_alone(bed, tmp_path):
    a, b, c, _ = bed.names
    run_id = f"s{uuid.uuid4().hex[:8]}"
    try:
        with by_hand(bed, tmp_path, 3, ["topology.min_nodes=2"], run_id) as procs:
            copied(tmp_path, run_id, range(3), procs)
            link(bed, c, up=False)
            (code0, said0), (code1, said1), (code2, said2) = finish(procs, timeout=240)
    finally:
        link(bed, c, up=True)
    done_on(run_folder(tmp_path, 0, run_id), said0, code0, world_size=2)
    assert code1 == 0, said1
    change = the_change(run_folder(tmp_path, 0, run_id), [a, b, c], [a, b], [c])
    assert "lease in the job's etcd expired" in change["cause"], change
    assert code2 == 1 and re.search(seen("cut off", bed), said2), said2  # c did not train on alone
    assert "resumed from" not in said2 and not membership(run_folder(tmp_path, 2, run_id))
    one_lineage([tmp_path / 'out' / 'steps.jsonl'])
    nothing_left(run_id, LEFT_ON_HOSTS_S)


def test_a_rank_that_fails_restarts_the_attempt_on_the_same_hosts_once_every_host_ended_it(bed, tmp_path):
    """No host lost: a rank killed (its host's `run` lives on); every host ends the attempt and the decision is the
    same hosts, the restart counted; no change of membership is recorded."""
    run_id = f"r{uuid.uuid4().hex[:8]}"
    with by_hand(bed, tmp_path, 3, ["topology.min_nodes=2"], run_id) as procs:
        copied(tmp_path, run_id, range(3), procs)
        rank_of(procs[1]).kill()
        done = finish(procs, timeout=200)
    for code, said in done:
        assert code == 0 and re.search(seen("same hosts", bed), said), said
    done_on(run_folder(tmp_path, 0, run_id), done[0][1], done[0][0], world_size=3)
    assert len(resumed_steps(done[0][1])) == 1 and not membership(run_folder(tmp_path, 0, run_id))
    one_lineage([tmp_path / 'out' / 'steps.jsonl'])
    nothing_left(run_id, LEFT_ON_HOSTS_S)


def test_a_host_whose_link_comes_back_is_taken_back_and_a_second_time_not_within_rejoin_after_s(bed, tmp_path):
    """Host 2's link down until the others went on without it, then up: its `run`, which lived on, learns that it was
    left out and stands by as a host back; host 0 asks every rank to stop at the next checkpoint, and the grown
    attempt trains at world size 3, no step lost. Then down and up again (it flaps): lost again, it stands by again,
    and is not taken back a second time within launcher.rejoin_after_s (600 s here): the job finishes on two, and host
    2's `run` ends with it. The two hosts' rank 0 holds once it trained at world size 2 until host 2 stands by (the
    gate), so the job cannot end before the first return."""
    a, b, c, _ = bed.names
    run_id = f"f{uuid.uuid4().hex[:8]}"
    steps = 6 * STEPS  # (time for two flaps before the end)
    gate = tmp_path / "host-2-back"
    hold = ["topology.min_nodes=2", "launcher.rejoin_after_s=600", f"+recipe.hold_after={2 * EVERY}",
            "+recipe.hold_world=2", f"+recipe.gate={gate}", "+recipe.hold_s=240"]
    trained_at = tmp_path / "out" / "steps.jsonl"  # host 0 stays host 0: rank 0's steps are there

    def training(world: int, attempt: int) -> bool:
        """Rank 0 took a step of ``attempt`` at world size ``world`` lately (its words looked for: the last line may
        be being written)."""
        return any(f'"world": {world}, "attempt": {attempt},' in line
                   for line in trained_at.read_text().splitlines()[-3:])

    try:
        with by_hand(bed, tmp_path, 3, hold, run_id, steps=steps) as procs:
            copied(tmp_path, run_id, range(3), procs)
            link(bed, c, up=False)
            wait_until(lambda: re.search(seen("restarting", bed), procs[0].stdout), 120,
                       "host 0 restarting without host 2", alive=procs[:2])
            link(bed, c, up=True)
            wait_until(lambda: re.search(seen("back", bed), procs[2].stdout), 120, "host 2 standing by",
                       alive=procs)
            gate.touch()
            wait_until(lambda: training(3, 2), 120, "training on three again (attempt 3)", alive=procs)
            link(bed, c, up=False)
            wait_until(lambda: procs[0].stdout.count("manual: restarting on 2 host(s)") == 2, 120,
                       "host 0 restarting without host 2 again", alive=procs[:2])
            link(bed, c, up=True)
            (code0, said0), (code1, said1), (code2, said2) = finish(procs, timeout=240)
    finally:
        link(bed, c, up=True)
    done_on(run_folder(tmp_path, 0, run_id), said0, code0, world_size=2, steps=steps)
    assert code1 == code2 == 0, (said1[-2000:], said2[-4000:])
    for key in ("left out", "back", "host taken in"):
        assert re.search(seen(key, bed), said2), (key, said2)
    assert said2.count(f"manual: host {c} back: waiting") == 2, said2
    assert re.search(seen("ready", bed), said0) and re.search(seen("grown", bed), said0), said0
    assert said0.count(f"manual: {c} ready: the job takes it in") == 1, said0  # once, as the rule says
    lost, joined, again = membership(run_folder(tmp_path, 0, run_id))
    assert [(ch["lost"], ch["joined"], ch["after"]) for ch in (lost, joined, again)] == [
        ([c], [], [a, b]), ([], [c], [a, b, c]), ([c], [], [a, b])], (lost, joined, again)
    assert (joined["world_size_before"], joined["world_size_after"], joined["steps_lost"]) == (2, 3, 0), joined
    trained = one_lineage([trained_at], steps=steps)
    worlds = sorted({(line["attempt"], line["world"]) for line in trained})
    assert [w for _, w in worlds] == [3, 2, 3, 2], worlds  # the world size over time
    nothing_left(run_id, LEFT_ON_HOSTS_S)


# --------------------------------------------------------------------------- faults the watch cannot see

# gloo's connections on the data network (the bed's second: data0); etcd, host 0's store and every watch on the lan
DATA = ["topology.min_nodes=2", "backend.socket_ifname=data0"]


def worlds(trained: list[dict]) -> list[tuple[int, int]]:
    """(attempt, world size) of rank 0's steps, in the order trained."""
    return sorted({(line["attempt"], line["world"]) for line in trained})


def test_a_host_whose_data_network_is_cut_while_its_lan_answers_is_named_and_left_out(bed, tmp_path):
    """Host 1's data interface down once every host holds a save: its `run`, its etcd member and its lease live on over
    the lan, so no watch finds it lost. The ranks wait in their all-reduce until the stall watch
    (launcher.stall_timeout_s=10) ends the attempt on every host: the same hosts again. The data-network check before
    that attempt names host 1 (its pairs with host 0 and host 2 failed): it leaves, saying why, and hosts 0 and 2
    finish at world size 2, from the last save; membership.jsonl says why."""
    a, b, c, _ = bed.names
    run_id = f"d{uuid.uuid4().hex[:8]}"
    try:
        with by_hand(bed, tmp_path, 3, [*DATA, "launcher.stall_timeout_s=10"], run_id) as procs:
            copied(tmp_path, run_id, range(3), procs)
            data_link(bed, b, up=False)
            (code0, said0), (code1, said1), (code2, said2) = finish(procs, timeout=280)
    finally:
        data_link(bed, b, up=True)
    done_on(run_folder(tmp_path, 0, run_id), said0, code0, world_size=2)
    assert code2 == 0, said2[-3000:]
    assert code1 == 1 and re.search(seen("named", bed), said1) and "Traceback" not in said1, said1[-3000:]
    assert f"manual: {b} is left out: host 1 ({b}) failed the data-network check before attempt 2" in said0, said0
    (change,) = membership(run_folder(tmp_path, 0, run_id))  # (attempt: the last whose ranks began)
    assert (change["attempt"], change["next_attempt"], change["before"], change["after"], change["lost"]) == (
        0, 2, [a, b, c], [a, c], [b]), change
    assert change["cause"].startswith(f"{b}: left out: host 1 ({b}) failed the data-network check before attempt 2"), \
        change
    trained = one_lineage([tmp_path / "out" / "steps.jsonl"])
    assert [w for _, w in worlds(trained)] == [3, 2] and resumed_steps(said0), (worlds(trained), said0[-2000:])
    nothing_left(run_id, LEFT_ON_HOSTS_S)


def test_two_hosts_that_cannot_reach_each_other_on_the_data_network_leave_one_out_not_the_job(bed, tmp_path):
    """Hosts 1 and 2 cannot reach each other on the data network from the start (each reaches host 0 there, and the
    lan between them answers): the check before attempt 1 names host 2 (one failed pair each: the tie goes to the
    higher node rank), in seconds, before any rank starts; it leaves, and hosts 0 and 1 train from step 0 at world
    size 2 to the end. No attempt waits in a collective."""
    a, b, c, _ = bed.names
    run_id = f"p{uuid.uuid4().hex[:8]}"
    data_cut_between(bed, b, c, cut=True)
    try:
        with by_hand(bed, tmp_path, 3, DATA, run_id) as procs:
            (code0, said0), (code1, said1), (code2, said2) = finish(procs, timeout=240)
    finally:
        data_cut_between(bed, b, c, cut=False)
    done_on(run_folder(tmp_path, 0, run_id), said0, code0, world_size=2)
    assert code1 == 0, said1[-3000:]
    named = (f"host 2 ({c}) failed the data-network check before attempt 1 (1 of the failed pair(s): host 1 ({b}) and "
             f"host 2 ({c}): 1 -> 2: ")
    assert code2 == 1 and f"manual: this host is left out of the job: {named}" in said2, said2[-3000:]
    assert "Traceback" not in said2 and "is left out" not in said2.split("of the job: ", 1)[1], said2[-3000:]
    assert f"error: network: {named}" in said0, said0[-3000:]
    change = the_change(run_folder(tmp_path, 0, run_id), [a, b, c], [a, b], [c])
    assert change["cause"].startswith(f"{c}: left out: {named}"), change
    trained = one_lineage([tmp_path / "out" / "steps.jsonl"])
    assert worlds(trained) == [(1, 2)] and not resumed_steps(said0), worlds(trained)
    assert "stall" not in said0 and "timed out" not in said0, said0[-3000:]
    nothing_left(run_id, LEFT_ON_HOSTS_S)


def test_losing_host_0_makes_the_next_host_host_0_with_its_copy_of_the_checkpoint(bed, tmp_path):
    a, b, c, _ = bed.names
    run_id = f"z{uuid.uuid4().hex[:8]}"
    with by_hand(bed, tmp_path, 3, ["topology.min_nodes=2"], run_id) as procs:
        copied(tmp_path, run_id, range(3), procs)
        assert kill(procs[0]) >= 4
        kept = complete_copy(checkpoint(tmp_path, 1, run_id))
        _, (code1, said1), (code2, said2) = finish(procs, timeout=200)
    folder = run_folder(tmp_path, 1, run_id)
    done_on(folder, said1, code1, world_size=2)
    assert code2 == 0, said2
    change = the_change(folder, [a, b, c], [b, c], [a])
    assert (change["resumed_from"], change["resumed_from_host"], change["resumed_from_save"]) == (
        kept.step, b, kept.seq), (change, kept)
    assert re.search(rf"resumed from {re.escape(str(folder))}/checkpoints/last\.pt: step {kept.step}\n", said1), said1
    one_lineage([tmp_path / 'out' / 'steps.jsonl'])
    nothing_left(run_id, LEFT_ON_HOSTS_S)


def test_host_0_killed_while_it_sends_a_copy_leaves_the_newest_complete_copy_to_resume(bed, tmp_path):
    """Host 0's link slowed (a token bucket of 16 Mbit/s) once every host holds save 1, with 4 MiB in each checkpoint:
    save 2 takes seconds to reach the others, and host 0 is killed while host 1 receives it. Hosts 1 and 2 hold save 1
    whole (a copy being written never replaces it), and the job resumes from the newest complete copy: save 1, or
    save 2 where what host 0 had already queued on its slowed link reached a host whole; never an older one."""
    a, b, c, _ = bed.names
    run_id = f"w{uuid.uuid4().hex[:8]}"
    h = bed.host(a)
    slowed = ["tc", "qdisc", "add", "dev", h.ifname, "root", "tbf", "rate", "16mbit", "burst", "32kbit", "latency",
              "2s"]
    receiving = checkpoint(tmp_path, 1, run_id).parent
    gate = tmp_path / "slowed"  # rank 0 holds after save 1 until the link is slowed: save 2 cannot land before
    try:
        with by_hand(bed, tmp_path, 3, ["topology.min_nodes=2", "+recipe.pad_mb=4", f"+recipe.hold_after={EVERY}",
                                        f"+recipe.gate={gate}"], run_id) as procs:
            copied(tmp_path, run_id, range(3), procs)
            subprocess.run(bed.exec_argv(h, slowed), check=True)
            gate.touch()
            wait_until(lambda: any(p.name.endswith(".tmp") for p in receiving.iterdir()), 120,
                       "host 1 receiving save 2", alive=procs)
            assert kill(procs[0]) >= 4
            kept = [complete_copy(checkpoint(tmp_path, i, run_id)) for i in (1, 2)]
            _, (code1, said1), (code2, said2) = finish(procs, timeout=200)
    finally:
        subprocess.run(bed.exec_argv(h, ["tc", "qdisc", "del", "dev", h.ifname, "root"]), check=False)
    assert [k.seq for k in kept] == [1, 1] and kept[0].step == EVERY, kept  # save 2 never landed whole
    done_on(run_folder(tmp_path, 1, run_id), said1, code1, world_size=2)
    assert code2 == 0, said2
    change = the_change(run_folder(tmp_path, 1, run_id), [a, b, c], [b, c], [a])
    # save 1, or save 2 where the bytes already queued on host 0's slowed link (tbf: up to 2 s of them) reached a
    # host whole after the kill: the newest complete copy, never an older one
    assert (change["resumed_from"], change["resumed_from_save"]) in ((EVERY, 1), (2 * EVERY, 2)), change
    assert not [p for p in receiving.iterdir() if p.name.endswith(".tmp")]  # the half-received copy was removed
    one_lineage([tmp_path / 'out' / 'steps.jsonl'])
    nothing_left(run_id, LEFT_ON_HOSTS_S)


def test_a_relaunch_after_host_0_was_lost_resumes_from_the_newest_copy_on_any_host(bed, tmp_path):
    """Host 0 killed after save 1; hosts 1 and 2 finish the job (their copies: the last step). The same three
    commands again (a relaunch of the run id): host 0's folder holds save 1 only, the others the last save; the job
    resumes from theirs, and host 0's stale copy is replaced, not sent to the others."""
    run_id = f"l{uuid.uuid4().hex[:8]}"
    with by_hand(bed, tmp_path, 3, ["topology.min_nodes=2"], run_id) as procs:
        copied(tmp_path, run_id, range(3), procs)
        assert kill(procs[0]) >= 4
        _, (code1, said1), (code2, _) = finish(procs, timeout=200)
    assert code1 == code2 == 0, said1
    stale, newest = (complete_copy(checkpoint(tmp_path, i, run_id)) for i in (0, 1))
    assert stale.seq < newest.seq and newest.step == STEPS, (stale, newest)
    with by_hand(bed, tmp_path, 3, ["topology.min_nodes=2"], run_id) as procs:
        done = finish(procs, timeout=200)
    assert [code for code, _ in done] == [0, 0, 0], done
    assert resumed_steps(done[0][1]) == [STEPS], done[0][1]  # host 0, rank 0 again: from host 1's copy
    assert [complete_copy(checkpoint(tmp_path, i, run_id)).step for i in (1, 2)] == [STEPS, STEPS]  # not overwritten
    nothing_left(run_id, LEFT_ON_HOSTS_S)


def test_a_host_paused_longer_than_every_window_is_left_out_and_taken_back_when_it_wakes(bed, tmp_path):
    """Host 0's `run` and everything it started stopped (SIGSTOP: a frozen machine, its etcd member and rank 0 with
    it) until the others went on without it, then woken: it learns the decision that left it out and stands by, and
    the new host 0 takes it back at the next checkpoint, after the others (host 2 now); its rank trained no step
    between its pause and its return (one lineage), and the job finishes at world size 3. The others' rank 0 holds
    before the job's last steps until the woken host stands by (the gate): the test does not race their last steps."""
    a, b, c, _ = bed.names
    run_id, steps = f"p{uuid.uuid4().hex[:8]}", 3 * STEPS  # (after the hold, steps enough to take host 0 back)
    gate = tmp_path / "woken-host-back"  # (attempt 1's rank 0 on host 1 holds after this step; attempt 0 is frozen
    hold = [f"+recipe.hold_after={STEPS}", f"+recipe.gate={gate}"]  # long before it, after the first save)
    with by_hand(bed, tmp_path, 3, ["topology.min_nodes=2", *hold], run_id, steps=steps) as procs:
        copied(tmp_path, run_id, range(3), procs)
        frozen = tree(procs[0])
        for p in frozen:
            p.send_signal(signal.SIGSTOP)
        try:
            wait_until(lambda: re.search(r"manual: restarting on 2 host\(s\)", procs[1].stdout), 120,
                       "host 1 restarting without host 0", alive=procs[1:])
        finally:
            for p in frozen:
                p.send_signal(signal.SIGCONT)
        wait_until(lambda: f"manual: host {a} back: waiting" in procs[0].stdout, 120, "the woken host 0 standing by",
                   alive=procs)
        gate.touch()
        (code0, said0), (code1, said1), (code2, said2) = finish(procs, timeout=200)
    assert code0 == code2 == 0 and re.search(r"the other hosts went on without this one", said0), (said0, said2)
    assert f"manual: host {a} taken in: attempt 3 on 3 host(s) ({b}, {c}, {a})" in said0, said0
    done_on(run_folder(tmp_path, 1, run_id), said1, code1, world_size=3, steps=steps)
    lost, joined = membership(run_folder(tmp_path, 1, run_id))
    assert (lost["lost"], lost["after"], joined["joined"], joined["after"]) == ([a], [b, c], [a], [b, c, a]), (
        lost, joined)
    one_lineage([tmp_path / 'out' / 'steps.jsonl'], steps=steps)
    nothing_left(run_id, LEFT_ON_HOSTS_S)


def test_a_one_way_drop_between_two_hosts_never_splits_the_job(bed, tmp_path):
    """Host 2's packets to host 0 dropped (a blackhole route: host 0 still sends to it): the data network between them
    fails (the collectives time out; host 2's next attempt finds no route to its master and is refused), and so may
    host 0's or host 2's way to etcd's leader, whichever it is. However it ends, one group trains: the hosts of the
    last decision finish (one host 0's summary says done), a host left out ends (exit 1, or 2 where its share was
    refused) and trains no step after, and the ranks' steps are one lineage. Host 0's rank, stuck sending to host 2,
    looks behind in each hang while host 2's rank says nothing: no host is named for hanging the job (it named host 0
    once, and the job ended with one host left)."""
    a, b, c, _ = bed.names
    run_id = f"o{uuid.uuid4().hex[:8]}"
    h = bed.host(c)
    to_a = ["ip", "route", "add", "blackhole", f"{bed.host(a).addr}/32"]
    try:
        with by_hand(bed, tmp_path, 3, ["topology.min_nodes=2", "init.timeout_s=10"], run_id) as procs:
            copied(tmp_path, run_id, range(3), procs)
            subprocess.run(bed.exec_argv(h, to_a), check=True)
            done = finish(procs, timeout=240)
    finally:
        subprocess.run(bed.exec_argv(h, ["ip", "route", "del", "blackhole", f"{bed.host(a).addr}/32"]), check=False)
    codes = [code for code, _ in done]
    assert not any("hung the job" in said for _, said in done), done
    assert set(codes) <= {0, 1, 2} and codes.count(0) >= 2, done  # min_nodes=2: a group of two or three finished
    finished = [i for i, code in enumerate(codes) if code == 0]
    summaries = [json.loads((run_folder(tmp_path, i, run_id) / "run_summary.json").read_text()) for i in range(3)]
    assert [s["status"] for s in summaries].count("done") >= 1 and {summaries[i]["status"] for i in finished} == {
        "done"}, summaries
    for i, code in enumerate(codes):
        if code != 0:
            assert "resumed from" not in done[i][1], done[i][1]  # the host left out trained no more
    story = ("attempt", "next_attempt", "before", "after", "lost")
    changes = [[{k: c[k] for k in story} for c in membership(run_folder(tmp_path, i, run_id))] for i in finished]
    assert all(c == changes[0] for c in changes), changes  # every host of the group tells one story
    one_lineage([tmp_path / 'out' / 'steps.jsonl'])
    nothing_left(run_id, LEFT_ON_HOSTS_S)


def test_an_etcd_member_lost_leaves_the_job_to_finish_as_it_was(bed, tmp_path):
    """Host 1's etcd member killed (its `run` and rank live on): two of three members decide, every host's lease
    lives through them, and the job finishes on its three hosts, no change recorded."""
    run_id = f"e{uuid.uuid4().hex[:8]}"
    with by_hand(bed, tmp_path, 3, ["topology.min_nodes=2"], run_id) as procs:
        copied(tmp_path, run_id, range(3), procs)
        member_of(procs[1]).kill()
        done = finish(procs, timeout=200)
    assert [code for code, _ in done] == [0, 0, 0], done
    done_on(run_folder(tmp_path, 0, run_id), done[0][1], done[0][0], world_size=3)
    assert not membership(run_folder(tmp_path, 0, run_id))
    one_lineage([tmp_path / 'out' / 'steps.jsonl'])
    nothing_left(run_id, LEFT_ON_HOSTS_S)


def test_a_preempted_host_leaves_and_the_others_go_on_from_the_checkpoint_its_stop_saved(bed, tmp_path):
    """SIGTERM to host 2's `run` (a spot machine taken back): it says in etcd that it leaves, the ranks of every host
    checkpoint on the stop request and return, and hosts 0 and 1 go on without it from that checkpoint: no step
    lost. (Ctrl-C, SIGINT, still stops the job everywhere.)"""
    a, b, c, _ = bed.names
    run_id = f"t{uuid.uuid4().hex[:8]}"
    with by_hand(bed, tmp_path, 3, ["topology.min_nodes=2"], run_id) as procs:
        copied(tmp_path, run_id, range(3), procs)
        procs[2].send_signal(signal.SIGTERM)
        (code0, said0), (code1, said1), (code2, said2) = finish(procs, timeout=200)
    done_on(run_folder(tmp_path, 0, run_id), said0, code0, world_size=2)
    assert code1 == 0, said1
    assert code2 == 128 + signal.SIGTERM and re.search(seen("left", bed), said2), said2
    change = the_change(run_folder(tmp_path, 0, run_id), [a, b, c], [a, b], [c])
    assert change["cause"].startswith(f"{c}: it left: SIGTERM to its `run`"), change
    stopped_at = int(re.search(r"stop requested: checkpoint at step (\d+)", said0)[1])
    assert change["resumed_from"] == stopped_at and change["steps_lost"] == 0, change
    one_lineage([tmp_path / 'out' / 'steps.jsonl'])
    nothing_left(run_id, LEFT_ON_HOSTS_S)


def test_a_spare_standing_by_takes_the_lost_hosts_place_and_the_world_size_stays(bed, tmp_path):
    a, b, c, d = bed.names
    run_id = f"a{uuid.uuid4().hex[:8]}"
    with by_hand(bed, tmp_path, 3, [f"topology.spares=[{{name: {d}, devices: 1}}]"], run_id, spares=1) as procs:
        copied(tmp_path, run_id, range(3), procs)
        assert kill(procs[2]) >= 4
        (code0, said0), (code1, said1), _, (code3, said3) = finish(procs, timeout=200)
    found = done_on(run_folder(tmp_path, 0, run_id), said0, code0, world_size=3)
    assert code1 == code3 == 0, (said1, said3)
    change = the_change(run_folder(tmp_path, 0, run_id), [a, b, c], [a, b, d], [c])
    assert change["spares"] == [d] and (change["world_size_before"], change["world_size_after"]) == (3, 3), change
    assert re.search(seen("spare", bed), said0), said0
    assert re.search(seen("taken in", bed), said3), said3
    assert f"spare {d} in its place" in found["membership"][0], found
    one_lineage([tmp_path / 'out' / 'steps.jsonl'])
    nothing_left(run_id, LEFT_ON_HOSTS_S)


def test_a_spare_started_late_joins_up_to_max_nodes_at_the_next_checkpoint(bed, tmp_path):
    """Spare d's `run` typed once the job trains on a, b and c (topology.max_nodes=4): its member of the job's etcd
    starts as the bootstrap's (it never ran), it stands by, and host 0 takes it in at the next checkpoint: the job
    finishes at world size 4, no step lost. The three hosts' rank 0 holds once it trained at world size 3 until d
    stands by (the gate), so the job cannot end first."""
    a, b, c, d = bed.names
    run_id, steps = f"t{uuid.uuid4().hex[:8]}", 3 * STEPS
    gate = tmp_path / "spare-ready"
    args = [f"topology.spares=[{{name: {d}, devices: 1}}]", "topology.max_nodes=4", f"+recipe.hold_after={2 * EVERY}",
            "+recipe.hold_world=3", f"+recipe.gate={gate}", "+recipe.hold_s=240"]
    with by_hand(bed, tmp_path, 3, args, run_id, steps=steps) as procs:
        copied(tmp_path, run_id, range(3), procs)
        with typed_on(bed, tmp_path, 3, args, run_id, 3, steps) as spare:
            wait_until(lambda: f"manual: spare {d} ready" in spare.stdout, 240, "spare d standing by",
                       alive=[*procs, spare])
            gate.touch()
            done = finish([*procs, spare], timeout=240)
    assert [code for code, _ in done] == [0, 0, 0, 0], [said[-3000:] for _, said in done]
    found = done_on(run_folder(tmp_path, 0, run_id), done[0][1], done[0][0], world_size=4, steps=steps)
    (joined,) = membership(run_folder(tmp_path, 0, run_id))
    assert (joined["before"], joined["after"], joined["lost"], joined["joined"]) == ([a, b, c], [a, b, c, d], [], [d])
    assert (joined["world_size_before"], joined["world_size_after"], joined["steps_lost"]) == (3, 4, 0), joined
    assert joined["cause"] == f"{d}: a spare, topology.max_nodes leaving room (it stood by in the job's etcd)", joined
    assert f"manual: spare {d} taken in: attempt 2 on 4 host(s) ({a}, {b}, {c}, {d})" in done[3][1], done[3][1]
    assert f"{d} taken in after attempt 1" in found["membership"][0], found
    one_lineage([tmp_path / 'out' / 'steps.jsonl'], steps=steps)
    nothing_left(run_id, LEFT_ON_HOSTS_S)


def test_a_host_the_spec_does_not_list_arrives_and_joins_up_to_max_nodes_at_the_next_checkpoint(bed, tmp_path):
    """The job lists a, b and c (topology.max_nodes=4); once they train, `run` is typed on d with the same command and
    launcher.manual.host=<d's name> launcher.manual.addr=<d's address>: d arrives as a client of the job's etcd (its
    members are the listed machines'), stands by with its name, address and devices in its member key, and host 0
    takes it in at the next checkpoint: the job finishes at world size 4, no step lost; membership.jsonl says d
    arrived. The three hosts' rank 0 holds once it trained at world size 3 until d stands by (the gate)."""
    a, b, c, d = bed.names
    run_id, steps = f"a{uuid.uuid4().hex[:8]}", 3 * STEPS
    gate = tmp_path / "arrived"
    args = ["topology.min_nodes=2", "topology.max_nodes=4", f"+recipe.hold_after={2 * EVERY}", "+recipe.hold_world=3",
            f"+recipe.gate={gate}", "+recipe.hold_s=240"]
    with by_hand(bed, tmp_path, 3, args, run_id, steps=steps) as procs:
        copied(tmp_path, run_id, range(3), procs)
        with typed_on(bed, tmp_path, 3, [*args, f"launcher.manual.addr={bed.host(d).addr}"], run_id, 3, steps,
                      as_host=d) as arriving:
            wait_until(lambda: f"manual: spare {d} ready" in arriving.stdout, 240, "host d standing by",
                       alive=[*procs, arriving])
            gate.touch()
            done = finish([*procs, arriving], timeout=240)
    assert [code for code, _ in done] == [0, 0, 0, 0], [said[-3000:] for _, said in done]
    said_d = done[3][1]
    assert re.search(seen("arrives", bed), said_d) and "Traceback" not in said_d, said_d[-3000:]
    found = done_on(run_folder(tmp_path, 0, run_id), done[0][1], done[0][0], world_size=4, steps=steps)
    (joined,) = membership(run_folder(tmp_path, 0, run_id))
    assert (joined["before"], joined["after"], joined["lost"], joined["joined"]) == ([a, b, c], [a, b, c, d], [], [d])
    assert (joined["world_size_before"], joined["world_size_after"], joined["steps_lost"]) == (3, 4, 0), joined
    assert joined["cause"] == (f"{d}: arrived, a host the spec does not list, topology.max_nodes leaving room (it "
                               f"stood by in the job's etcd)"), joined
    assert f"manual: spare {d} taken in: attempt 2 on 4 host(s) ({a}, {b}, {c}, {d})" in said_d, said_d[-3000:]
    assert f"{d} taken in after attempt 1" in found["membership"][0], found
    trained = one_lineage([tmp_path / 'out' / 'steps.jsonl'], steps=steps)
    assert [w for _, w in worlds(trained)] == [3, 4], worlds(trained)
    nothing_left(run_id, LEFT_ON_HOSTS_S)


def test_a_lost_hosts_run_typed_again_joins_at_the_next_checkpoint_and_the_world_size_returns(bed, tmp_path):
    """Host 2's every process killed; hosts 0 and 1 go on; the same command typed again on host 2: its member of the
    job's etcd joins the cluster again (removed and added: its data went with its machine), its `run` stands by as a
    host back, and host 0 asks every rank to stop at the next checkpoint: attempt 3 runs on the three hosts from the
    checkpoint that stop saved (no step lost), and the job finishes at world size 3; membership.jsonl holds the loss,
    then the join."""
    a, b, c, _ = bed.names
    run_id = f"r{uuid.uuid4().hex[:8]}"
    steps = 3 * STEPS
    # the two hosts' rank 0 holds once it trained on (world size 2) until host 2 stands by: the job cannot end before
    # host 2's `run` is back, however long its start takes on a loaded machine
    gate = tmp_path / "host-2-back"
    hold = ["topology.min_nodes=2", f"+recipe.hold_after={2 * EVERY}", "+recipe.hold_world=2", f"+recipe.gate={gate}",
            "+recipe.hold_s=240"]
    with by_hand(bed, tmp_path, 3, hold, run_id, steps=steps) as procs:
        copied(tmp_path, run_id, range(3), procs)
        assert kill(procs[2]) >= 4
        wait_until(lambda: re.search(rf"manual: restarting on 2 host\(s\) \({a}, {b}\)", procs[0].stdout), 120,
                   "host 0 restarting without host 2", alive=procs[:2])
        with typed_on(bed, tmp_path, 3, hold, run_id, 2, steps) as again:
            wait_until(lambda: re.search(seen("back", bed), again.stdout), 240, "host 2 standing by",
                       alive=[*procs[:2], again])
            gate.touch()
            (code0, said0), (code1, said1), (code2, said2) = finish([procs[0], procs[1], again], timeout=240)
    found = done_on(run_folder(tmp_path, 0, run_id), said0, code0, world_size=3, steps=steps)
    assert code1 == code2 == 0, (said1, said2)
    for key in ("etcd again", "back", "host taken in"):
        assert re.search(seen(key, bed), said2), (key, said2)
    for key in ("ready", "grown"):
        assert re.search(seen(key, bed), said0), (key, said0)
    lost, joined = membership(run_folder(tmp_path, 0, run_id))
    assert (lost["lost"], lost["after"], joined["joined"], joined["before"], joined["after"]) == (
        [c], [a, b], [c], [a, b], [a, b, c]), (lost, joined)
    assert (joined["attempt"], joined["next_attempt"], joined["world_size_before"], joined["world_size_after"]) == (
        1, 2, 2, 3), joined
    assert joined["cause"] == (f"{c}: back: its `run` started again, or left out while it lived on (it stood by in "
                               f"the job's etcd)"), joined
    stopped_at = int(re.findall(r"stop requested: checkpoint at step (\d+)", said0)[-1])
    assert joined["resumed_from"] == stopped_at and joined["steps_lost"] == 0 and joined["to_first_step_s"] > 0, joined
    assert f"{c} taken in after attempt 2" in found["membership"][1], found
    one_lineage([tmp_path / 'out' / 'steps.jsonl'], steps=steps)
    nothing_left(run_id, LEFT_ON_HOSTS_S)


def test_fewer_hosts_left_than_the_job_s_etcd_needs_ends_the_job_on_the_others(bed, tmp_path):
    """Four hosts, topology.min_nodes=3 (the job's own etcd needs 3 of its 4 members): two killed, the other two
    cannot decide (no majority of etcd's members) and end, with that cause; nobody trains on."""
    run_id = f"m{uuid.uuid4().hex[:8]}"
    with by_hand(bed, tmp_path, 4, ["topology.min_nodes=3"], run_id) as procs:
        copied(tmp_path, run_id, range(4), procs)
        assert kill(procs[2]) + kill(procs[3]) >= 8
        (code0, said0), (code1, said1), _, _ = finish(procs, timeout=200)
    assert code0 == code1 == 1, (said0, said1)
    for said in (said0, said1):
        assert re.search(seen("cut off", bed), said), said
    assert "resumed from" not in said0 + said1
    nothing_left(run_id, LEFT_ON_HOSTS_S)


def test_two_hosts_go_on_with_one_under_an_etcd_of_the_users(bed, tmp_path):
    """topology.min_nodes=1 of two hosts: refused with the job's own etcd (it needs both members: the dry run says
    so); with an etcd the user runs (here one member on the bed's bridge, outside the hosts), host 1 killed, host 0
    goes on alone."""
    a, b, _, _ = bed.names
    run_id = f"u{uuid.uuid4().hex[:8]}"
    refused = subprocess.run(bed.exec_argv(a, [RUN, "launcher=manual", "init=tcp", "topology=custom",
                                               f"topology.hosts=[{{name: {a}, devices: 1}},{{name: {b}, devices: 1}}]",
                                               "topology.min_nodes=1", "launcher.max_restarts=3", "dry_run=true"]),
                             capture_output=True, text=True, cwd=tmp_path, env=bed.env(), timeout=120)
    assert refused.returncode == 2 and ("error: topology.min_nodes: 1 with the job's own etcd: it has a member on each "
                                        "of the 2 host(s) and spare(s) and decides while 2 of 2 are up") in \
        refused.stderr, refused.stderr
    with local_etcd(bed.bridge_addr) as endpoint:  # the user's, outside the hosts
        with by_hand(bed, tmp_path, 2, ["topology.min_nodes=1", f"launcher.manual.etcd=[{endpoint}]"], run_id) as procs:
            copied(tmp_path, run_id, range(2), procs)
            assert kill(procs[1]) >= 3
            (code0, said0), _ = finish(procs, timeout=200)
    done_on(run_folder(tmp_path, 0, run_id), said0, code0, world_size=1)
    the_change(run_folder(tmp_path, 0, run_id), [a, b], [a], [b])
    one_lineage([tmp_path / 'out' / 'steps.jsonl'])
    nothing_left(run_id, LEFT_ON_HOSTS_S)


@pytest.mark.docs
def test_the_readme_quotes_what_these_tests_see():
    """docs/lost-hosts.md shows real output of these tests: each quoted line is one they assert."""
    check_readme_quotes("When a host is lost", SAID, "tests/e2e/test_lost_hosts_manual.py")
