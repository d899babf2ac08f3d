"""A made-up clock for tests of code that waits: time moves only when the code under test sleeps on it (or the test
moves it), so a test of a 30 s window takes no time and no timing can be off on a busy machine."""

from __future__ import annotations


class Clock:
    """``clock()`` is the time; ``clock.sleep(s)`` moves it on by ``s`` and records the pause (no real sleep)."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now
        self.pauses: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0, seconds
        self.pauses.append(round(seconds, 6))
        self.now += seconds
