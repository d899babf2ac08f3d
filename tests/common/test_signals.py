"""runner.common.signals: signals named as specs name them, and handlers that are put back."""

from __future__ import annotations

import os
import signal

import pytest

from runner.common.signals import StopRequest, handling, is_signal_name, parse_signal, passing_on, stop_signals

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("text, sig", [("USR1", signal.SIGUSR1), ("SIGUSR2", signal.SIGUSR2), ("B:USR1@90", signal.SIGUSR1),
                                        ("R:SIGTERM@30", signal.SIGTERM), ("10", signal.Signals(10)), (None, signal.SIGUSR1)])
def test_signal_names_as_specs_give_them(text, sig) -> None:
    assert parse_signal(text) == sig


def test_what_is_not_a_signal() -> None:
    assert is_signal_name("USR1") and not is_signal_name("NOPE") and not is_signal_name("999")


def test_handlers_are_put_back_after_the_block() -> None:
    seen = []
    before = signal.getsignal(signal.SIGUSR2)
    with handling((signal.SIGUSR2, signal.SIGUSR2), lambda s, f: seen.append(s)):  # a signal twice: once
        os.kill(os.getpid(), signal.SIGUSR2)
    assert seen == [signal.SIGUSR2]
    assert signal.getsignal(signal.SIGUSR2) is before


def test_a_stop_request_is_its_own_object_set_by_the_signal_it_was_installed_for() -> None:
    """Each process's request is an object of its own (no state shared through the class): the one installed is
    set by the signal, another is not."""
    asked, other = StopRequest(), StopRequest()
    with handling((signal.SIGUSR2,), signal.SIG_DFL):  # the handler put back after the test
        asked.install(signal.SIGUSR2)
        assert not asked.requested
        os.kill(os.getpid(), signal.SIGUSR2)
    assert asked.requested and not other.requested


def test_handlers_are_put_back_when_the_block_raises() -> None:
    before = signal.getsignal(signal.SIGUSR2)
    with pytest.raises(RuntimeError):
        with handling((signal.SIGUSR2,), signal.SIG_IGN):
            raise RuntimeError("inside")
    assert signal.getsignal(signal.SIGUSR2) is before


def test_sigint_sigterm_and_the_stop_signal_are_passed_on_once_each() -> None:
    assert stop_signals(signal.SIGUSR1) == (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
    assert stop_signals(signal.SIGTERM) == (signal.SIGINT, signal.SIGTERM)  # a stop signal that is SIGTERM: once


def test_while_passing_on_each_of_the_signals_goes_to_the_one_given_and_the_handlers_come_back_after() -> None:
    before = signal.getsignal(signal.SIGUSR2)
    passed: list[int] = []
    with passing_on(signal.SIGUSR2, passed.append):
        os.kill(os.getpid(), signal.SIGUSR2)
    assert passed == [signal.SIGUSR2] and signal.getsignal(signal.SIGUSR2) == before
