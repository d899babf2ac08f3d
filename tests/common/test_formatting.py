"""runner.common.formatting: numbers and durations as every screen shows them."""

from __future__ import annotations

import pytest

from runner.common.formatting import duration, error_line, number, rank_list

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("value, shown", [(0.96875, "0.9688"), (18732.4, "18732"), (420, "420"), (None, ""),
                                          ("done", "done"), (1e-5, "1e-05")])
def test_numbers(value, shown) -> None:
    assert number(value) == shown


@pytest.mark.parametrize("seconds, shown", [(4.123, "4.1 s"), (725, "12 min 05 s"), (11220, "3 h 07 min")])
def test_durations(seconds, shown) -> None:
    assert duration(seconds) == shown


def test_the_error_line_is_the_line_that_says_what_went_wrong() -> None:
    assert error_line("\n  \nValueError: bad lr\n  more detail\n") == "ValueError: bad lr"
    wrapped = "\n\n-- Process 0 terminated with the following error:\nTraceback (most recent call last):\n" \
              '  File "x.py", line 3, in worker\nRuntimeError: the innermost error'
    assert error_line(wrapped) == "RuntimeError: the innermost error"
    assert error_line("") == ""
    # a message that begins with newlines (RuntimeError("\n\nthe-real-message")): its first words, not "RuntimeError:"
    assert error_line("RuntimeError: \n\nthe-real-message here\nmore") == "RuntimeError: the-real-message here"


def test_a_long_error_line_is_cut_between_words_never_inside_a_number() -> None:
    line = "RuntimeError: " + "x" * 123 + " Timed out waiting 300000ms for recv"
    assert error_line(line) == "RuntimeError: " + "x" * 123 + " Timed out waiting…"
    assert error_line(line + "\nsecond line", limit=None) == line  # the whole first line
    assert error_line("y" * 200, limit=10) == "y" * 9 + "…"  # one word: cut where it must
    assert error_line("a, b; c " * 3, limit=12) == "a, b; c a…"  # no comma left hanging before the mark


def test_ranks_on_one_line_show_the_first_few_and_how_many_there_are() -> None:
    assert rank_list([0, 1, 2], 12) == "0, 1, 2" and rank_list([], 12) == ""
    assert rank_list(list(range(14)), 12) == "0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, ... (14)"  # a host's report
    assert rank_list(list(range(20)), 16, sep=",") == "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,... (20)"  # a hang's
