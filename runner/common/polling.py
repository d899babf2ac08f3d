"""Waiting for what another process or host makes — a file, a record on the job's channel, a port that opens —
by asking again: one policy for every such loop of the runner.

The policy: ask at once; ask again every ``interval_s`` until the answer will do or ``wait_s`` have passed; a
pause never runs past the deadline, so the last question is asked at it; the caller gets the last answer (or
exception) and says what it means. (Slurm's job states are followed on a schedule of their own, which backs off
while nothing changes: runner.launchers.slurm.follow.)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

POLL_S = 0.1  # how often a local file or store is asked again, unless a caller says otherwise

Clock = Callable[[], float]
Sleep = Callable[[float], None]


def poll(look: Callable[[], T], done: Callable[[T], bool], wait_s: float, interval_s: float = POLL_S, *,
         clock: Clock = time.monotonic, sleep: Sleep = time.sleep) -> T:
    """``look()`` until ``done(answer)``, or until ``wait_s`` seconds have passed; the last answer."""
    deadline = clock() + wait_s
    while True:
        answer = look()
        left = deadline - clock()
        if done(answer) or left <= 0:
            return answer
        sleep(min(interval_s, left))


def retry(attempt: Callable[[], T], on: type[BaseException] | tuple[type[BaseException], ...], wait_s: float,
          interval_s: float = POLL_S, *, clock: Clock = time.monotonic, sleep: Sleep = time.sleep) -> T:
    """``attempt()`` again while it raises one of ``on`` and ``wait_s`` seconds have not passed; what it returns.
    Its last exception reaches the caller; any other exception at once. (``on=()``: one attempt.)"""
    deadline = clock() + wait_s
    while True:
        try:
            return attempt()
        except on:
            left = deadline - clock()
            if left <= 0:
                raise
        sleep(min(interval_s, left))
