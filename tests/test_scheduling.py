"""tests/scheduling.py: the files handed to the workers longest first, the durations file read, and the machine's
reference loop in the session's header."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from scheduling import longest_first, pytest_report_header, recorded_durations, reference_loop_s

pytestmark = pytest.mark.unit


@dataclass(frozen=True)
class Item:
    nodeid: str


def test_files_go_longest_first_unlisted_ones_before_all_and_each_files_tests_keep_their_order() -> None:
    items = [Item("a.py::x"), Item("b.py::x"), Item("a.py::y"), Item("new.py::x"), Item("c.py::x"), Item("b.py::y")]
    ordered = longest_first(items, {"a.py": 5.0, "b.py": 30.0, "c.py": 1.0})  # type: ignore[arg-type]
    assert [i.nodeid for i in ordered] == ["new.py::x", "b.py::x", "b.py::y", "a.py::x", "a.py::y", "c.py::x"]


def test_without_a_durations_file_every_file_is_unlisted(tmp_path) -> None:
    assert recorded_durations(tmp_path / "none.json") == {}
    (tmp_path / "d.json").write_text('{"tests/x.py": 2}')
    assert recorded_durations(tmp_path / "d.json") == {"tests/x.py": 2.0}


def test_the_header_says_the_cores_and_the_reference_loops_seconds(pytestconfig) -> None:
    assert 0 < reference_loop_s(rounds=1) < 60
    header = pytest_report_header(pytestconfig)
    assert header.startswith("machine: ") and " cores; the reference loop (tests/scheduling.py) takes " in header
