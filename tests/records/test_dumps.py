"""runner.records.dumps: a rank's record of its collectives travels as JSON (the run folder, the job's channel) and
comes back whole; what is not a dump reads as none; the shapes and the entries of a group read as the reports need."""

from __future__ import annotations

import json

import pytest

from runner.records.dumps import Collective, GroupRecord, RankDump

pytestmark = pytest.mark.unit

ENTRIES = (Collective(3, "all_reduce", ((4, 2),), ("torch.float32",), 100.5),
           Collective(4, "broadcast", ((8,), (2, 2)), ("torch.int64", "torch.float16"), 101.0))
DUMP = RankDump(1, "node1", 102.25, "request", "flight recorder",
                (GroupRecord("0", 4, 3, ENTRIES), GroupRecord("1", 0, -1)), at="train.py:57 in main")


def test_a_dump_comes_back_whole_through_json() -> None:
    back = RankDump.from_document(json.loads(json.dumps(DUMP.document())))
    assert back == DUMP


def test_what_is_not_a_dump_reads_as_none() -> None:
    assert RankDump.from_document({"host": "node1"}) is None  # no rank
    assert RankDump.from_document({"rank": 0, "groups": [{"group": "0"}]}) is None  # a group without its counts
    assert RankDump.from_document({"rank": 2}) == RankDump(2, "", 0.0, "", "")  # the rest defaults


def test_a_group_and_an_entry_by_name_and_number() -> None:
    assert DUMP.group("0").entry(4) is ENTRIES[1] and DUMP.group("0").entry(5) is None
    assert DUMP.group("1").entries == () and DUMP.group("7") is None
    assert ENTRIES[1].shape() == "torch.int64[8], torch.float16[2, 2]"
    assert Collective(1, "barrier").shape() == "" and Collective(1, "x", ((3,),)).shape() == "[3]"
