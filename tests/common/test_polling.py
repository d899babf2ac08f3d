"""runner.common.polling: the one policy of the runner's loops that ask again (on a made-up clock: no sleeps)."""

from __future__ import annotations

import pytest

from clocks import Clock
from runner.common.polling import poll, retry

pytestmark = pytest.mark.unit


def test_poll_returns_the_first_answer_that_will_do() -> None:
    clock, answers = Clock(100.0), iter([1, 2, 3, 4])
    assert poll(lambda: next(answers), lambda a: a >= 3, 10.0, 0.5, clock=clock, sleep=clock.sleep) == 3
    assert clock.pauses == [0.5, 0.5]


def test_poll_asks_last_at_the_deadline_and_gives_the_last_answer() -> None:
    clock, looks = Clock(100.0), []
    got = poll(lambda: looks.append(round(clock.now, 6)) or len(looks), lambda a: False, 1.0, 0.4, clock=clock,
               sleep=clock.sleep)
    assert got == 4 and looks == [100.0, 100.4, 100.8, 101.0]  # no pause runs past the deadline
    assert clock.pauses == [0.4, 0.4, 0.2]


def test_poll_with_no_time_asks_once() -> None:
    clock = Clock(100.0)
    assert poll(lambda: "x", lambda a: False, 0.0, clock=clock, sleep=clock.sleep) == "x" and clock.pauses == []


def test_retry_until_it_returns() -> None:
    clock, tries = Clock(100.0), iter([ConnectionRefusedError(), ConnectionRefusedError(), "open"])

    def attempt() -> str:
        value = next(tries)
        if isinstance(value, Exception):
            raise value
        return value

    assert retry(attempt, ConnectionRefusedError, 5.0, 0.25, clock=clock, sleep=clock.sleep) == "open"
    assert clock.pauses == [0.25, 0.25]


def test_retry_gives_up_at_the_deadline_with_the_last_exception() -> None:
    clock, count = Clock(100.0), [0]

    def attempt() -> None:
        count[0] += 1
        raise ConnectionRefusedError(f"try {count[0]}")

    with pytest.raises(ConnectionRefusedError, match="try 4"):
        retry(attempt, (ConnectionRefusedError, TimeoutError), 0.7, 0.25, clock=clock, sleep=clock.sleep)
    assert clock.pauses == [0.25, 0.25, 0.2]


def test_retry_passes_other_exceptions_on_at_once() -> None:
    clock = Clock(100.0)

    def attempt() -> None:
        raise TimeoutError("dropped")

    with pytest.raises(TimeoutError):
        retry(attempt, ConnectionRefusedError, 5.0, clock=clock, sleep=clock.sleep)
    with pytest.raises(TimeoutError):
        retry(attempt, (), 5.0, clock=clock, sleep=clock.sleep)  # nothing is retried
    assert clock.pauses == []
