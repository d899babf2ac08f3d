"""runner.records.watch_files: a request for the ranks' dumps, their answers, their heartbeats and a hang's verdict,
as files of the run folder (no processes)."""

from __future__ import annotations

import pytest

from runner.records.dumps import Collective, GroupRecord, RankDump
from runner.records.watch_files import (
    RankWatchFiles,
    clear_diagnosis,
    collect_dumps,
    end_dumps,
    last_request,
    read_diagnosis,
    request_dumps,
    requested_since,
    write_diagnosis,
)

pytestmark = pytest.mark.unit


def test_requests_and_dumps_in_the_run_folder(paths) -> None:
    assert last_request(paths) is None and requested_since(paths, 0) is None
    asked = request_dumps(paths, "stall")
    assert last_request(paths) == asked and requested_since(paths, asked - 1) == "stall"
    assert requested_since(paths, asked) is None
    groups = (GroupRecord("0", 3, -1, (Collective(3, "all_reduce", ((4,),), ("Float",), asked - 15.0),)),)
    fresh = RankDump(0, "n", asked + 0.5, "stall", "flight recorder", groups, "t.py:1 in f")
    RankWatchFiles(paths, 0).write_dump(fresh)
    RankWatchFiles(paths, 1).write_dump(RankDump(1, "n", asked - 10, "old", "fr"))  # an earlier attempt's
    found = collect_dumps(paths, range(2), since=asked, wait_s=0)
    assert list(found) == [0] and found[0] == fresh
    RankWatchFiles(paths, 1).write_beat(123.5)
    assert RankWatchFiles(paths, 1).last_progress() == 123.5 and RankWatchFiles(paths, 2).last_progress() is None


def test_the_files_are_the_ones_the_run_folder_names(paths) -> None:
    request_dumps(paths, "request")
    RankWatchFiles(paths, 2).write_dump(RankDump(2, "n", 1.0, "end", "fr"))
    RankWatchFiles(paths, 2).write_beat(1.0)
    write_diagnosis(paths, "timeout", "ranks 0,1 wait", None)
    assert sorted(p.name for p in paths.logs.iterdir()) == sorted(
        p.name for p in (paths.dump_request, paths.diagnosis, paths.rank(2).dump, paths.rank(2).beat))


def test_the_dumps_of_the_ranks_end_and_a_dump_that_is_not_one(paths) -> None:
    RankWatchFiles(paths, 0).write_dump(RankDump(0, "n", 1.0, "end", "fr"))
    RankWatchFiles(paths, 1).write_dump(RankDump(1, "n", 1.0, "stall", "fr"))
    paths.rank(2).dump.write_text('{"host": "n"}')  # no rank: not a dump
    paths.rank(3).dump.write_text("[1, 2")
    assert list(end_dumps(paths, range(5))) == [0]
    assert RankWatchFiles(paths, 2).dump() is None and RankWatchFiles(paths, 3).dump() is None


def test_a_verdict_is_kept_until_an_attempt_clears_it(paths) -> None:
    assert read_diagnosis(paths) is None
    write_diagnosis(paths, "stall", "no rank completed a collective", {"waiting": [0, 2]})
    assert read_diagnosis(paths) == {"waiting": [0, 2], "kind": "stall", "text": "no rank completed a collective",
                                     "attempt": paths.attempt}  # (the hang rule takes only the attempt before's)
    request_dumps(paths, "stall")
    clear_diagnosis(paths)
    assert read_diagnosis(paths) is None and last_request(paths) is None
