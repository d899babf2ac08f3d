"""runner.worker.hung_hosts: each hang of an attempt recorded once from its diagnosis, and the rule that names the
host whose ranks were behind in the two attempts before (the verdict it gives crosses the job's channel:
tests/worker/test_pair_check.py; a preparation refused so: tests/worker/test_preparation.py; on namespace hosts:
tests/e2e/test_lost_hosts.py)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from runner.records.paths import RunPaths
from runner.records.watch_files import write_diagnosis
from runner.worker.hung_hosts import Hang, hangs, named, note

pytestmark = pytest.mark.unit

HOSTS = ["a", "b", "c"]


def hang(attempt: int, behind: tuple[str, ...] = ("c",), waiting: tuple[str, ...] = ("a", "b"), kind: str = "stall",
         collective: str = "all_reduce #20", silent: tuple[int, ...] = ()) -> Hang:
    return Hang(attempt, kind, collective, behind, waiting, silent)


def test_the_host_behind_in_the_two_attempts_before_is_named_with_both_hangs() -> None:
    found = named([hang(0), hang(1, kind="timeout", collective="all_reduce #31")], 2, HOSTS)
    assert found == (2, "hung the job in attempts 1 and 2: its ranks never entered the collective the other hosts' "
                        "ranks waited in (all_reduce #20, stall; then all_reduce #31, timeout)")


@pytest.mark.parametrize("recorded, attempt, why", [
    ([hang(1)], 2, "one hang only: a host slow once"),
    ([hang(0), hang(2)], 3, "not in a row: attempt 1 did not hang"),
    ([hang(0), hang(1)], 3, "the attempt before this one did not hang"),
    ([hang(0, behind=("b",), waiting=("a", "c")), hang(1)], 2, "another host behind each time"),
    ([hang(0, behind=("b", "c"), waiting=("a",)), hang(1, behind=("b", "c"), waiting=("a",))], 2, "two hosts behind"),
    ([hang(0, waiting=("c",)), hang(1)], 2, "no other host's ranks waited: nothing to compare with"),
    ([hang(0, behind=("d",)), hang(1, behind=("d",))], 2, "a host not in this attempt"),
    ([hang(0, behind=("a",), waiting=("b",), silent=(2,)), hang(1, behind=("a",), waiting=("b",))], 2,
     "a rank said nothing in the first: host c's packets to host 0 dropped, host 0's rank stuck sending to it"),
    ([hang(0, behind=("a",), waiting=("b",)), hang(1, behind=("a",), waiting=("b",), silent=(2,))], 2,
     "a rank said nothing in the second"),
])
def test_no_host_is_named_unless_the_same_one_was_behind_alone_twice_in_a_row(recorded, attempt, why) -> None:
    assert named(recorded, attempt, HOSTS) is None, why


STALL = {"op": "all_reduce", "collective": 20, "behind_hosts": ["c"], "waiting_hosts": ["a", "b"]}


def test_the_hang_of_the_attempt_before_is_recorded_once_from_its_diagnosis(tmp_path) -> None:
    first = RunPaths(tmp_path, "r1", attempt=0)
    paths = dataclasses.replace(first, attempt=1)
    paths.logs.mkdir()
    note(paths)
    assert hangs(paths) == []  # no diagnosis: nothing hung
    write_diagnosis(first, "stall", "stall: ...", STALL)  # (written in attempt 0, read before attempt 1)
    note(paths)
    note(paths)  # (a preparation made again: the same hang)
    assert hangs(paths) == [hang(0)]
    second = dataclasses.replace(paths, attempt=2)
    write_diagnosis(paths, "timeout", "...", {"op": "all_reduce", "collective": 31, "behind_hosts": ["c"],
                                              "waiting_hosts": ["a", "b"], "silent": [3]})
    note(second)
    assert hangs(second) == [hang(0), hang(1, kind="timeout", collective="all_reduce #31", silent=(3,))]
    assert [json.loads(line)["attempt"] for line in paths.hangs.read_text().splitlines()] == [0, 1]


def test_a_diagnosis_left_by_an_attempt_before_the_last_is_not_the_last_ones_hang(tmp_path) -> None:
    """Attempt 0 hung; attempt 1 was refused before any rank started (a host without a route to the master), so
    attempt 0's diagnosis is still there before attempt 2: one hang, not two in a row (it named host 0 so once)."""
    first = RunPaths(tmp_path, "r1", attempt=0)
    first.logs.mkdir()
    write_diagnosis(first, "timeout", "...", STALL)
    note(dataclasses.replace(first, attempt=1))
    third = dataclasses.replace(first, attempt=2)
    note(third)
    assert hangs(third) == [hang(0, kind="timeout")]
    assert named(hangs(third), 2, HOSTS) is None


@pytest.mark.parametrize("kind, facts", [
    ("left", {"left": [2], "lost": ["c"]}),  # a host lost: its ranks gone, not behind
    ("stall", {"op": "all_reduce", "collective": 4, "behind_hosts": [], "waiting_hosts": ["a", "b", "c"]}),  # every
    # rank waited in it: the data network, which the check before the next attempt names
    ("stall", None),  # no rank recorded a collective
])
def test_a_diagnosis_with_no_host_behind_is_no_hang_of_a_host(tmp_path, kind, facts) -> None:
    paths = RunPaths(tmp_path, "r1", attempt=1)
    paths.logs.mkdir()
    write_diagnosis(dataclasses.replace(paths, attempt=0), kind, "...", facts)
    note(paths)
    assert not paths.hangs.exists()


def test_a_line_that_cannot_be_read_is_passed_over(tmp_path) -> None:
    paths = RunPaths(tmp_path, "r1", attempt=3)
    paths.logs.mkdir()
    paths.hangs.write_text("not json\n" + json.dumps({"attempt": "x"}) + "\n" + json.dumps(hang(1).document()) + "\n")
    assert hangs(paths) == [hang(1)]
