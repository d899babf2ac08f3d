"""runner.records.json_lines: documents appended one a line and read back in order, a line being written passed
over, no file read as none."""

from __future__ import annotations

import pytest

from runner.records.json_lines import append_document, documents

pytestmark = pytest.mark.unit


def test_documents_come_back_in_order_and_a_line_not_json_is_passed_over(tmp_path) -> None:
    path = tmp_path / "records.jsonl"
    assert documents(path) == []
    append_document(path, {"b": 1, "a": [2]})
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"half": \n')  # (a writer's line not yet whole)
    append_document(path, ["x"])
    assert documents(path) == [{"a": [2], "b": 1}, ["x"]]
    assert path.read_text().splitlines()[0] == '{"a": [2], "b": 1}'  # keys sorted, one line each
