"""runner.worker.inbox: what reaches a host agent from outside is kept until taken, once; the ends it was told stay
known (the job ends with this attempt; the hosts gone); an arrival wakes the agent's wait."""

from __future__ import annotations

import os
import signal
import time

import pytest

from runner.worker.channel_records import JobFailure
from runner.worker.inbox import AgentInbox

pytestmark = pytest.mark.unit

LOST = JobFailure(rank=None, host="c", text="ssh: connection to c lost", time=1.0)


def test_signals_are_taken_in_the_order_they_came_once() -> None:
    inbox = AgentInbox()
    inbox.signalled(signal.SIGUSR1)
    inbox.signalled(signal.SIGTERM)
    assert inbox.take_signals() == [signal.SIGUSR1, signal.SIGTERM] and inbox.take_signals() == []
    inbox.signalled(signal.SIGINT)
    assert inbox.take_signals() == [signal.SIGINT]


def test_the_first_sigint_or_sigterm_is_known_after_it_was_taken_and_means_stopping() -> None:
    inbox = AgentInbox()
    inbox.signalled(signal.SIGUSR1)
    assert inbox.first_stop() is None and not inbox.stopping()
    inbox.signalled(signal.SIGTERM)
    inbox.take_signals()
    assert inbox.first_stop() == signal.SIGTERM and inbox.stopping()


def test_an_end_from_outside_is_taken_once_and_stays_known_with_the_host_gone() -> None:
    inbox = AgentInbox()
    assert not inbox.ended and inbox.gone() == {}
    inbox.end(LOST)
    inbox.end(JobFailure(rank=3, host="b", text="boom", time=2.0))  # a rank's: no host gone
    assert inbox.take_ends() == [LOST, JobFailure(rank=3, host="b", text="boom", time=2.0)]
    assert inbox.take_ends() == [] and inbox.ended and inbox.stopping()
    assert inbox.gone() == {"c": "ssh: connection to c lost"}


def test_ctrl_backslash_is_taken_once() -> None:
    inbox = AgentInbox()
    inbox.ask_where()
    assert inbox.take_where() and not inbox.take_where()


def test_an_arrival_wakes_the_wait_at_once() -> None:
    inbox = AgentInbox()
    never_r, never_w = os.pipe()  # the zygote's end: nothing comes
    try:
        with inbox.waking():
            inbox.ask_where()
            started = time.monotonic()
            inbox.wait(never_r, timeout_s=30.0)
            assert time.monotonic() - started < 10.0
    finally:
        os.close(never_r)
        os.close(never_w)
