"""runner.records.outcomes: the files that say how each rank ended, written by ranks and launchers, read by the
launchers and the reports."""

from __future__ import annotations

import json

import pytest

from runner.records.outcomes import ErrorRecord, RankOutcome, all_done, any_failed, first_failures, outcomes, timed_out

pytestmark = pytest.mark.unit


def _error(rank: int, at: float, killed: bool = False) -> ErrorRecord:
    return ErrorRecord(rank=rank, local_rank=rank, host="node0", machine=None if killed else "m",
                       pid=None if killed else 100 + rank, timestamp=at, exception=f"RuntimeError: rank {rank}",
                       traceback="Traceback ...", killed=killed)


def test_a_rank_that_returned(paths) -> None:
    rank = RankOutcome(paths, 1)
    assert not rank.done and not rank.returned_on_request and rank.result == {}
    rank.mark_done(stopped=False, result={"acc": 0.97, "steps": 420})
    assert rank.done and not rank.returned_on_request and rank.result == {"acc": 0.97, "steps": 420}
    assert json.loads(rank.done_file.read_text()) == {"stopped": False, "result": {"acc": 0.97, "steps": 420}}
    assert rank.done_file == paths.logs / "rank00001.done"


def test_a_rank_that_returned_because_it_was_asked_to_stop(paths) -> None:
    rank = RankOutcome(paths, 0)
    rank.mark_done(stopped=True)
    assert rank.returned_on_request and rank.result == {}


def test_the_first_failure_is_a_killed_rank_then_the_earliest(paths) -> None:
    RankOutcome(paths, 0).record_error(_error(0, 10.0))
    RankOutcome(paths, 2).record_error(_error(2, 5.0))
    RankOutcome(paths, 3).record_error(_error(3, 20.0, killed=True))
    assert [e.rank for e in first_failures(paths, range(4))] == [3, 2, 0]
    assert RankOutcome(paths, 3).error() == _error(3, 20.0, killed=True) and RankOutcome(paths, 1).error() is None
    assert any_failed(paths, range(4)) and not any_failed(paths, [1])


def test_a_timeout_is_the_ranks_verdict_and_an_older_records_text(paths) -> None:
    said = ErrorRecord(rank=0, local_rank=0, host="node0", machine="m", pid=100, timestamp=1.0,
                       exception="ValueError: timeout_s must be > 0")
    RankOutcome(paths, 0).record_error(said)
    RankOutcome(paths, 1).record_error(ErrorRecord(rank=1, local_rank=1, host="node0", machine="m", pid=101,
                                                   timestamp=2.0, exception="RuntimeError: Wait timeout", timeout=True))
    assert [timed_out(RankOutcome(paths, r).error()) for r in (0, 1)] == [False, True]
    older = {k: v for k, v in json.loads(RankOutcome(paths, 0).error_file.read_text()).items() if k != "timeout"}
    # written before ranks gave their verdict: judged by its text
    assert timed_out(ErrorRecord.from_document(older)) is True
    assert timed_out(ErrorRecord.from_document({**older, "exception": "ValueError: bad lr"})) is False
    assert ErrorRecord.from_json("not json") is None and ErrorRecord.from_document({"rank": 1}) is None


def test_all_done_and_clearing_an_attempt(paths) -> None:
    ranks = outcomes(paths, range(2))
    for r in ranks:
        r.mark_joined()
        r.mark_done(stopped=False)
    assert all_done(paths, range(2)) and all(r.joined for r in ranks)
    ranks[0].record_error(_error(0, 1.0))
    ranks[0].clear()
    assert not ranks[0].done and not ranks[0].joined and not ranks[0].failed and all_done(paths, [1])


def test_a_damaged_done_file_reads_as_no_result(paths) -> None:
    rank = RankOutcome(paths, 0)
    rank.done_file.write_text("stopped\n")  # the format before the result was recorded
    assert rank.done and not rank.returned_on_request and rank.result == {}
