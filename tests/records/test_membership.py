"""runner.records.membership: membership.jsonl, the record of a job's hosts changing."""

from __future__ import annotations

import json

import pytest

from runner.records.membership import MembershipChange, append_change, changes
from runner.records.paths import RunPaths

pytestmark = pytest.mark.unit

LOST = MembershipChange(time=1700.0, attempt=0, next_attempt=1, before=("a", "b", "c"), after=("a", "c"), lost=("b",),
                        cause="ssh exited 255 (Timeout, server b not responding.)", world_size_before=3,
                        world_size_after=2, last_step=57, resumed_from=40, to_first_step_s=6.25)


def test_each_change_is_a_line_of_membership_jsonl_and_reads_back_equal(tmp_path) -> None:
    paths = RunPaths(tmp_path, "r1")
    assert changes(paths) == []
    spare = MembershipChange(time=1800.0, attempt=1, next_attempt=2, before=("a", "c"), after=("c", "s"), lost=("a",),
                             cause="ssh was killed by SIGKILL", spares=("s",))
    append_change(paths, LOST)
    append_change(paths, spare)
    assert changes(paths) == [LOST, spare]
    first = json.loads(paths.membership.read_text().splitlines()[0])
    assert first["steps_lost"] == 17 and first["lost"] == ["b"] and first["to_first_step_s"] == 6.25


def test_a_change_says_itself_in_a_line() -> None:
    assert LOST.line() == ("b lost in attempt 1 (ssh exited 255 (Timeout, server b not responding.)): attempt 2 on 2 "
                           "host(s), world size 2; 17 step(s) lost, first step 6.2 s after")
    ended = MembershipChange(time=1.0, attempt=2, next_attempt=None, before=("a", "b"), after=(), lost=("a",),
                             cause="2 host(s) left")
    assert ended.line() == "a lost in attempt 3 (2 host(s) left): the job ended"
    assert ended.steps_lost is None


def test_a_torn_line_is_skipped(tmp_path) -> None:
    paths = RunPaths(tmp_path, "r1")
    append_change(paths, LOST)
    with open(paths.membership, "a") as f:
        f.write('{"time": 1, "att')
    assert changes(paths) == [LOST]


def test_a_host_taken_in_says_so_and_reads_back_with_its_name(tmp_path) -> None:
    joined = MembershipChange(time=1900.0, attempt=1, next_attempt=2, before=("a", "c"), after=("a", "c", "b"), lost=(),
                              joined=("b",), cause="b: answered again (launcher.ssh.rejoin_s)", world_size_before=2,
                              world_size_after=3, last_step=30, resumed_from=30, to_first_step_s=6.3)
    assert joined.line() == ("b taken in after attempt 2 (b: answered again (launcher.ssh.rejoin_s)): attempt 3 on 3 "
                             "host(s), world size 3; 0 step(s) lost, first step 6.3 s after")
    paths = RunPaths(tmp_path, "r1")
    append_change(paths, joined)
    assert changes(paths) == [joined]
