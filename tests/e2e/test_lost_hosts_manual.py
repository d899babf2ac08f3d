"""A job that outlives its hosts (topology.min_nodes) under launcher=manual, on a bed of this module's own: four
namespace hosts, each `run` started in its host's namespace as a user types it there, each in a job folder of its
own (no shared file system), with no `run` that holds the job: the hosts watch each other and meet after a loss
(runner.launchers.manual). The bundled digits recipe on three hosts of one process: a host's every process killed,
a host's link taken down (no FIN, only silence: the cut host ends by itself, not training alone), a host that flaps
(lost, then back: not taken back), a rank's own failure (every host comes: the same hosts again), host 0 killed (the
next host serves the next attempt, from its own copy of the checkpoint), a spare's `run` standing by and called in
in a lost host's place, and too few hosts left. Each must end as
it says, membership.jsonl (in the run folder of the last attempt's host 0) must say what happened, the checkpoint
step must never go back, and nothing of the job may be left on any host."""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import psutil
import pytest

from runs import RUN, Started, check_readme_quotes, finish, processes_of, seen_in, stage_workloads, started, wait_until
from testbed_fixtures import Bed, bed_of_its_own

pytestmark = pytest.mark.timeout(300)

EPOCHS = 12  # the digits recipe saves every 5 epochs: a fault after the first checkpoint leaves 7 epochs to go
BATCH = 48  # divides over 3 and 2 processes

# What each host's `run` shows, as patterns of the bed's host names: README's "When a host is lost" quotes these
# lines (test_the_readme_quotes_what_these_tests_see checks it)
SAID = {
    "meeting": r"manual: attempt 1 ended; meeting the other hosts \({host0}, {host1}, {host2}\)",
    # said by the watch (within two keepalive intervals), or by the meeting where the attempt ended sooner
    "refuses": r"manual: host (2 \()?{host2}\)? lost: its `run` is gone \(its meeting point refuses\)",
    "restarting": r"manual: restarting on 2 host\(s\) \({host0}, {host1}\) from the last checkpoint: attempt 2 of 4 "
                  r"\(launcher\.max_restarts=3\)",
    "silent": r"manual: host {host2} lost: no answer for 8 s \(launcher\.manual\.keepalive_s=2\): its machine or network "
              r"is gone; ending this attempt",
    "cut off": r"manual: the job ends on this host: only 1 of the attempt's 3 hosts reached each other \({host2}\): not "
               r"more than half, so the others may go on without them",
    "hosts line": r"  hosts     {host2} lost in attempt 1 \({host2}: its `run` is gone",
    "too few": r"manual: the job ends: 2 host\(s\) left of 4, fewer than topology\.min_nodes=3",
    "same hosts": r"restarting: attempt 2 of 4 \(launcher\.max_restarts=3\); every host came to the meeting; the recipe "
                  r"resumes from its last checkpoint",
    "left out": r"manual: the job ends on this host: the other hosts went on without this one \({host0}, {host1}, from "
                r"attempt 2\): it came to the meeting too late",
    "spare": r"manual: restarting on 3 host\(s\) \({host0}, {host1}, {host3}\) from the last checkpoint: attempt 2 of 4 "
             r"\(launcher\.max_restarts=3\), spare\(s\) {host3} in the lost host's place",
    "called in": r"manual: spare {host3} called in: attempt 2 on 3 host\(s\) \({host0}, {host1}, {host3}\)",
}


def seen(key: str, bed: Bed) -> str:
    return seen_in(SAID, key, bed)


@pytest.fixture(scope="module")
def bed(tmp_path_factory) -> Iterator[Bed]:
    with bed_of_its_own(tmp_path_factory.mktemp("lost-hosts-manual-bed"), "--hosts", "4", "--prefix",
                        f"lm{uuid.uuid4().hex[:2]}") as made:
        yield made


@contextmanager
def by_hand(bed: Bed, tmp_path: Path, count: int, args: list[str], run_id: str,
            spares: int = 0) -> Iterator[list[Started]]:
    """`run ... launcher=manual launcher.manual.host=i run_id=...` in the namespaces of the bed's first ``count``
    hosts (and the ``spares`` after them, which ``args`` name), each in its own folder ``tmp_path/host<i>`` (the tests'
    workloads staged, as a user's checkout there)."""
    listed = "topology.hosts=[" + ",".join(f"{{name: {n}, devices: 1}}" for n in bed.names[:count]) + "]"
    with ExitStack() as stack:
        procs = []
        for i, name in enumerate(bed.names[:count + spares]):
            folder = stage_workloads(tmp_path / f"host{i}")
            argv = [RUN, "launcher=manual", "init=tcp", "topology=custom", listed, f"recipe.epochs={EPOCHS}",
                    f"recipe.global_batch_size={BATCH}", "launcher.max_restarts=3", "launcher.grace_s=2", *args,
                    f"launcher.manual.host={i}", f"run_id={run_id}"]
            procs.append(stack.enter_context(started(bed.exec_argv(name, argv), cwd=folder, env=bed.env(),
                                                     run_id=run_id, merged=True)))
        yield procs


def run_folder(tmp_path: Path, host: int, run_id: str) -> Path:
    return tmp_path / f"host{host}" / "outputs" / "runs" / run_id


def after_a_checkpoint(tmp_path: Path, run_id: str, procs: list[Started]) -> None:
    wait_until(lambda: (run_folder(tmp_path, 0, run_id) / "checkpoints" / "last.pt").exists(), 150,
               "host 0's first checkpoint", alive=procs)


def kill(proc: Started) -> int:
    """A host's `run` and everything it started killed at once: the machine gone, as its peers see it. How many."""
    root = psutil.Process(proc.proc.pid)
    every = [root, *root.children(recursive=True)]
    for p in every:
        try:
            p.kill()
        except psutil.Error:
            continue
    return len(every)


def rank_of(proc: Started, deadline_s: float = 60) -> psutil.Process:
    """The one rank of a host's `run`: a child of its zygote (`run`'s child: the rounds' zygote) that leads a session
    of its own (the zygote's other child, the agent's client of host 0's store, does not)."""
    found: list[psutil.Process] = []

    def look() -> bool:
        try:
            found[:] = [child for zygote in psutil.Process(proc.proc.pid).children()
                        if "runner.worker.zygote" in " ".join(zygote.cmdline())
                        for child in zygote.children() if os.getsid(child.pid) == child.pid]
        except (psutil.Error, ProcessLookupError):
            found.clear()
        return len(found) == 1

    wait_until(look, deadline_s, "the host's one rank", alive=[proc])
    return found[0]


def link(bed: Bed, host: str, up: bool) -> None:
    """``host``'s link to the others up or down (down: its packets are dropped, no connection is closed)."""
    h = bed.host(host)
    subprocess.run(bed.exec_argv(h, ["ip", "link", "set", h.ifname, "up" if up else "down"]), check=True)


def membership(folder: Path) -> list[dict]:
    path = folder / "membership.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def done_on(folder: Path, said: str, code: int, world_size: int) -> dict:
    """The job finished on this host 0: exit 0, `done`, a final accuracy, at ``world_size``."""
    assert code == 0, said
    found = json.loads((folder / "run_summary.json").read_text())
    assert found["status_text"] == "done: every rank returned (exit 0)", found
    assert found["world_size"] == world_size, found
    final = int(re.search(r"final test accuracy: \S+ after (\d+) steps", said)[1])
    assert found["metrics_step"] == found["final_metrics"]["steps"] == final, found
    assert found["final_metrics"]["test_accuracy"] > 0.8, found
    return found


def resumed_steps(said: str) -> list[int]:
    return [int(s) for s in re.findall(r"resumed from \S+: step (\d+),", said)]


def nothing_left(run_id: str) -> None:
    wait_until(lambda: not processes_of(run_id), 30, "nothing of the job left on any host")


# --------------------------------------------------------------------------- the faults


def test_a_killed_host_leaves_the_job_to_finish_on_the_others(bed, tmp_path):
    a, b, c, _ = bed.names
    run_id = f"k{uuid.uuid4().hex[:8]}"
    with by_hand(bed, tmp_path, 3, ["topology.min_nodes=2"], run_id) as procs:
        after_a_checkpoint(tmp_path, run_id, procs)
        assert kill(procs[2]) >= 3  # its `run`, its zygote, its rank at least
        (code0, said0), (code1, said1), _ = finish(procs, timeout=200)
    found = done_on(run_folder(tmp_path, 0, run_id), said0, code0, world_size=2)
    assert code1 == 0, said1
    (change,) = membership(run_folder(tmp_path, 0, run_id))
    assert (change["attempt"], change["next_attempt"], change["before"], change["after"], change["lost"]) == (
        0, 1, [a, b, c], [a, b], [c]), change
    assert (change["world_size_before"], change["world_size_after"]) == (3, 2), change
    assert change["resumed_from"] > 0 and change["to_first_step_s"] > 0, change
    assert resumed_steps(said0) == [change["resumed_from"]], said0
    assert membership(run_folder(tmp_path, 1, run_id))[0]["after"] == [a, b]  # every host keeps the record
    for key in ("meeting", "refuses", "restarting", "hosts line"):
        assert re.search(seen(key, bed), said0), (key, said0)
    assert len(found["membership"]) == 1 and found["membership"][0].startswith(f"{c} lost in attempt 1 ("), found
    nothing_left(run_id)


def test_a_host_whose_link_goes_down_is_found_by_silence_and_ends_by_itself(bed, tmp_path):
    a, b, c, _ = bed.names
    run_id = f"s{uuid.uuid4().hex[:8]}"
    try:
        with by_hand(bed, tmp_path, 3, ["topology.min_nodes=2"], run_id) as procs:
            after_a_checkpoint(tmp_path, run_id, procs)
            link(bed, c, up=False)
            (code0, said0), (code1, said1), (code2, said2) = finish(procs, timeout=240)
    finally:
        link(bed, c, up=True)
    done_on(run_folder(tmp_path, 0, run_id), said0, code0, world_size=2)
    assert code1 == 0, said1
    assert re.search(seen("silent", bed), said0), said0
    (change,) = membership(run_folder(tmp_path, 0, run_id))
    assert (change["after"], change["lost"]) == ([a, b], [c]), change
    assert change["cause"].startswith(f"{c}: no answer for 8 s"), change
    assert change["resumed_from"] > 0 and change["steps_lost"] >= 0, change
    assert code2 == 1 and re.search(seen("cut off", bed), said2), said2  # c did not train on alone
    assert "resumed from" not in said2 and not membership(run_folder(tmp_path, 2, run_id))
    nothing_left(run_id)


def test_a_rank_that_fails_restarts_the_attempt_on_the_same_hosts_once_every_host_came_to_the_meeting(bed, tmp_path):
    """No host lost: a rank killed (its host's `run` lives on); the hosts meet, every one comes, and the next attempt
    runs on all of them, the restart counted; no change of membership is recorded."""
    run_id = f"r{uuid.uuid4().hex[:8]}"
    with by_hand(bed, tmp_path, 3, ["topology.min_nodes=2"], run_id) as procs:
        after_a_checkpoint(tmp_path, run_id, procs)
        rank_of(procs[1]).kill()
        done = finish(procs, timeout=200)
    for code, said in done:
        assert code == 0 and re.search(seen("same hosts", bed), said), said
    done_on(run_folder(tmp_path, 0, run_id), done[0][1], done[0][0], world_size=3)
    assert len(resumed_steps(done[0][1])) == 1 and not membership(run_folder(tmp_path, 0, run_id))
    nothing_left(run_id)


def test_a_host_that_flaps_is_lost_once_and_not_taken_back(bed, tmp_path):
    """Host 2's link down, and up again once the others restarted without it: it learns that they went on without
    it and ends; the job finishes on two hosts, one change recorded."""
    a, b, c, _ = bed.names
    run_id = f"f{uuid.uuid4().hex[:8]}"
    try:
        with by_hand(bed, tmp_path, 3, ["topology.min_nodes=2"], run_id) as procs:
            after_a_checkpoint(tmp_path, run_id, procs)
            link(bed, c, up=False)
            wait_until(lambda: re.search(seen("restarting", bed), procs[0].stdout), 120,
                       "host 0 restarting without host 2", alive=procs[:2])
            link(bed, c, up=True)
            (code0, said0), (code1, said1), (code2, said2) = finish(procs, timeout=240)
    finally:
        link(bed, c, up=True)
    done_on(run_folder(tmp_path, 0, run_id), said0, code0, world_size=2)
    assert code1 == 0, said1
    assert code2 == 1 and re.search(seen("left out", bed) + "|" + seen("cut off", bed), said2), said2
    (change,) = membership(run_folder(tmp_path, 0, run_id))
    assert (change["after"], change["lost"]) == ([a, b], [c]), change
    nothing_left(run_id)


def test_losing_host_0_makes_the_next_host_host_0_with_its_copy_of_the_checkpoint(bed, tmp_path):
    a, b, c, _ = bed.names
    run_id = f"z{uuid.uuid4().hex[:8]}"
    with by_hand(bed, tmp_path, 3, ["topology.min_nodes=2"], run_id) as procs:
        after_a_checkpoint(tmp_path, run_id, procs)
        wait_until(lambda: (run_folder(tmp_path, 1, run_id) / "checkpoints" / "last.pt").exists(), 60,
                   "host 1's copy of the checkpoint", alive=procs)  # (rank 0 sends it once it saved its own)
        assert kill(procs[0]) >= 3
        _, (code1, said1), (code2, said2) = finish(procs, timeout=200)
    folder = run_folder(tmp_path, 1, run_id)
    done_on(folder, said1, code1, world_size=2)
    assert code2 == 0, said2
    (change,) = membership(folder)
    assert (change["before"], change["after"], change["lost"]) == ([a, b, c], [b, c], [a]), change
    assert change["resumed_from"] > 0, change  # host 1 resumed from its own copy: no step went back to 0
    assert re.search(rf"resumed from {re.escape(str(folder))}/checkpoints/last\.pt: step {change['resumed_from']},",
                     said1), said1
    nothing_left(run_id)


def test_a_spare_standing_by_takes_the_lost_hosts_place_and_the_world_size_stays(bed, tmp_path):
    a, b, c, d = bed.names
    run_id = f"p{uuid.uuid4().hex[:8]}"
    with by_hand(bed, tmp_path, 3, [f"topology.spares=[{{name: {d}, devices: 1}}]"], run_id, spares=1) as procs:
        after_a_checkpoint(tmp_path, run_id, procs)
        assert kill(procs[2]) >= 3
        (code0, said0), (code1, said1), _, (code3, said3) = finish(procs, timeout=200)
    found = done_on(run_folder(tmp_path, 0, run_id), said0, code0, world_size=3)
    assert code1 == code3 == 0, (said1, said3)
    (change,) = membership(run_folder(tmp_path, 0, run_id))
    assert (change["after"], change["lost"], change["spares"]) == ([a, b, d], [c], [d]), change
    assert (change["world_size_before"], change["world_size_after"]) == (3, 3), change
    assert re.search(seen("spare", bed), said0), said0
    assert re.search(seen("called in", bed), said3), said3
    assert f"spare {d} in its place" in found["membership"][0], found
    nothing_left(run_id)


def test_fewer_hosts_left_than_min_nodes_ends_the_job_with_that_cause(bed, tmp_path):
    a, b, c, d = bed.names
    run_id = f"m{uuid.uuid4().hex[:8]}"
    with by_hand(bed, tmp_path, 4, ["topology.min_nodes=3"], run_id) as procs:
        after_a_checkpoint(tmp_path, run_id, procs)
        assert kill(procs[2]) + kill(procs[3]) >= 6
        (code0, said0), (code1, said1), _, _ = finish(procs, timeout=200)
    assert code0 == code1 == 1, (said0, said1)
    for said in (said0, said1):
        assert re.search(seen("too few", bed), said), said
    (change,) = membership(run_folder(tmp_path, 0, run_id))
    assert (change["next_attempt"], change["after"], sorted(change["lost"])) == (None, [], [c, d]), change
    nothing_left(run_id)


@pytest.mark.unit
def test_the_readme_quotes_what_these_tests_see():
    """README's "When a host is lost" shows real output of these tests: each quoted line is one they assert."""
    check_readme_quotes("### When a host is lost", SAID, "tests/e2e/test_lost_hosts_manual.py")
