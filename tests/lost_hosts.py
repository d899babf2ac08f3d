"""What the lost-host tests of every launcher share (tests/e2e/test_lost_hosts.py: ssh, test_lost_hosts_manual.py:
manual, test_lost_nodes_slurm.py: Slurm): the cheapest job that shows a lost host (tests/workloads/elastic.py: a tiny
weight, one all-reduce a step, a checkpoint every EVERY steps, a step every STEP_S seconds), a host's link taken down
and up, and the checks each fault ends with: the change membership.jsonl records, the exact step resumed (that of the
newest complete copy the hosts that went on held), one lineage of training (rank 0's steps.jsonl), and nothing left of
the run."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: runner.training imports torch, seconds that the link helpers do not need
    from runner.training.copies import CopyRecord

STEPS, EVERY, STEP_S = 150, 10, 0.05  # a checkpoint every 10 steps, 20 steps a second at most
LEFT_ON_HOSTS_S = 60  # runs.nothing_left's wait: a host cut off from the others ends its share by itself


def elastic_recipe(out_dir: Path, steps: int = STEPS) -> list[str]:
    """The overrides that run tests/workloads/elastic.py (staged in the job's folder), rank 0's steps to ``out_dir``
    (which must exist on the host of rank 0)."""
    return ["recipe=custom", "recipe.target=workloads.elastic:main", f"+recipe.steps={steps}", f"+recipe.every={EVERY}",
            f"+recipe.step_s={STEP_S}", f"+recipe.out_dir={out_dir}"]


def link(bed, host: str, up: bool) -> None:
    """``host``'s link to the others up or down (down: its packets are dropped, no connection is closed)."""
    h = bed.host(host)
    subprocess.run(bed.exec_argv(h, ["ip", "link", "set", h.ifname, "up" if up else "down"]), check=True)


def data_link(bed, host: str, up: bool) -> None:
    """``host``'s data link (``up --data-network``) up or down, its lan untouched: the host still answers there."""
    h = bed.host(host)
    assert h.data_ifname is not None, f"{host} has no data network: bring the bed up with --data-network"
    subprocess.run(bed.exec_argv(h, ["ip", "link", "set", h.data_ifname, "up" if up else "down"]), check=True)


def data_cut_between(bed, one: str, other: str, cut: bool) -> None:
    """The data addresses of ``one`` and ``other`` unreachable from each other (a blackhole route to the other's in
    each namespace), or reachable again (cut=False; routes already gone are fine). Every other pair, and the lan
    between these two, keep working: a fault between two hosts, not of either."""
    for here, there in ((one, other), (other, one)):
        addr = bed.host(there).data_addr
        assert addr is not None, f"{there} has no data network: bring the bed up with --data-network"
        route = ["ip", "route", "replace" if cut else "del", "blackhole", f"{addr}/32"]
        done = subprocess.run(bed.exec_argv(here, route), capture_output=True, text=True)
        assert done.returncode == 0 or (not cut and "No such process" in done.stderr), (route, here, done.stderr)


def membership(run_folder: Path) -> list[dict]:
    path = run_folder / "membership.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def the_change(run_folder: Path, before: list[str], after: list[str], lost: list[str]) -> dict:
    """The one change of membership recorded: attempt 1 on ``before``, attempt 2 on ``after``, ``lost`` lost."""
    (change,) = membership(run_folder)
    assert (change["attempt"], change["next_attempt"], change["before"], change["after"], change["lost"]) == (
        0, 1, before, after, lost), change
    assert (change["world_size_before"], change["world_size_after"]) == (len(before), len(after)), change
    return change


def done_on(run_folder: Path, said: str, code: int, world_size: int, steps: int = STEPS) -> dict:
    """The job finished: exit 0, `done`, every step, at ``world_size``. Its summary."""
    assert code == 0, said
    found = json.loads((run_folder / "run_summary.json").read_text())
    assert found["status_text"].startswith("done: every rank returned (exit 0)"), found
    assert found["world_size"] == world_size and found["final_metrics"]["steps"] == steps, found
    return found


def newest(checkpoints: Iterable[Path]) -> CopyRecord:
    """The newest complete copy among ``checkpoints`` (each host's last.pt): the one a restart must resume from."""
    from runner.training.copies import complete_copy
    copies = [c for c in (complete_copy(path) for path in checkpoints) if c is not None]
    assert copies, f"no complete copy among {list(checkpoints)}"
    return max(copies)


def resumed_as_it_must(change: dict, said: str, copy: CopyRecord, host: str | None) -> None:
    """The next attempt resumed from exactly ``copy`` (the newest complete copy the hosts that went on held, read
    when the fault came: a save needs every rank, so none can complete before the attempt ends), sent by ``host``
    (None: a folder every host shares); rank 0 says so."""
    assert (change["resumed_from"], change["resumed_from_save"]) == (copy.step, copy.seq), (change, copy)
    assert host is None or change["resumed_from_host"] == host, change
    assert resumed_steps(said) == [copy.step] and change["to_first_step_s"] > 0, said


def resumed_steps(said: str) -> list[int]:
    return [int(s) for s in re.findall(r"resumed from \S+: step (\d+)", said)]


def one_lineage(steps_files: Iterable[Path], finished: bool = True, steps: int = STEPS) -> list[dict]:
    """Rank 0's steps (steps.jsonl, merged in time where rank 0 moved between hosts) are one training: attempt after
    attempt, each from the step it resumed at (never past what was trained before, never back past a resume), the
    attempts never interleaved: one group trained at a time; ``finished``: to the last step. The steps, in order."""
    lines = sorted((json.loads(line) for path in steps_files if path.exists()
                    for line in path.read_text().splitlines()), key=lambda line: line["t"])
    attempt, step, trained = None, 0, 0
    for line in lines:
        if line["attempt"] != attempt:
            assert attempt is None or line["attempt"] > attempt, f"attempt {line['attempt']} after {attempt}: {line}"
            assert line["resumed"] <= trained and line["step"] == line["resumed"] + 1, (line, trained)
            attempt = line["attempt"]
        else:
            assert line["step"] == step + 1, f"two groups, or a step taken twice in one attempt: {line} after {step}"
        step, trained = line["step"], max(trained, line["step"])
    assert lines and (step == steps or not finished), lines[-1:]
    return lines
