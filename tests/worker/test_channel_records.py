"""runner.worker.channel_records: each record the job's channel carries goes to its document and comes back equal;
what is not one of them reads as None, never as a half record."""

from __future__ import annotations

import json

import pytest

from runner.records.outcomes import ErrorRecord
from runner.worker.channel_records import DumpRequest, JobFailure, RankEnding, RankReturned, StopAsked

pytestmark = pytest.mark.unit

KILLED = ErrorRecord(rank=3, local_rank=1, host="b", machine=None, pid=None, timestamp=12.5,
                     exception="killed by SIGKILL (no Python exception)", killed=True)


@pytest.mark.parametrize("record", [
    JobFailure(rank=3, host="b", text="RuntimeError: boom", time=1.5),
    JobFailure(rank=None, host="a", text="stall: no rank ...", time=2.0, stall=True),
    StopAsked(signal=15, host="a", time=3.0),
    DumpRequest(time=4.25, reason="stall"),
    RankEnding(host="b", code=-9, stopped=False, error=KILLED, returned=None, joined="gloo", end_dump=None),
    RankEnding(host="b", code=0, stopped=False, error=None,
               returned=RankReturned(stopped=True, result={"acc": 0.9}, ended=None), joined=None,
               end_dump={"rank": 2, "reason": "end"}),
], ids=["failure", "stall", "stop", "dumps", "killed", "returned"])
def test_each_record_crosses_as_json_and_comes_back_equal(record) -> None:
    kind = type(record)
    assert kind.from_document(json.loads(json.dumps(record.document()))) == record


def test_what_is_not_a_record_reads_as_none() -> None:
    for kind in (JobFailure, StopAsked, DumpRequest, RankEnding):
        assert kind.from_document(None) is None and kind.from_document([1, 2]) is None
    assert JobFailure.from_document({"rank": 1, "text": "no host"}) is None
    assert JobFailure.from_document({"rank": "2", "host": "b"}).rank is None  # no whole number: no rank of the job
    assert StopAsked.from_document({"signal": "TERM", "host": "a"}) is None
    assert DumpRequest.from_document({"reason": "stall"}) is None
    assert RankEnding.from_document({"host": "b", "code": "x", "error": {"rank": 1}}) == RankEnding(
        host="b", code=None, stopped=False, error=None, returned=None, joined=None, end_dump=None)
