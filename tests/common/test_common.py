"""runner.common: exit statuses, signal handling, timeout detection, number formatting."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from runner.common import exits
from runner.common.formatting import duration, number
from runner.common.signals import StopRequest, handling, is_signal_name, parse_signal
from runner.common.timeouts import is_timeout_text

pytestmark = pytest.mark.unit


def test_exit_statuses_of_signals_round_trip() -> None:
    assert exits.from_signal(signal.SIGINT) == 130 and exits.from_signal(signal.SIGTERM) == 143
    assert exits.signal_of(143) == signal.SIGTERM and exits.signal_of(2) is None and exits.signal_of(1) is None
    assert (exits.OK, exits.FAILED, exits.INVALID) == (0, 1, 2)


def test_exit_status_from_a_wait_status() -> None:
    ended = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    _, status = os.waitpid(ended.pid, 0)
    assert exits.from_wait_status(status) == 3
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    killed.send_signal(signal.SIGKILL)
    _, status = os.waitpid(killed.pid, 0)
    assert exits.from_wait_status(status) == 128 + signal.SIGKILL


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


@pytest.mark.parametrize("text, timeout", [
    ("RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms for recv", True),
    ("DistStoreError: Timed out after 301 seconds waiting for clients", True),
    ("torch.distributed.DistBackendError: NCCL watchdog: Timeout(ms)=600000", True),
    ("RuntimeError: Connection reset by peer", False),
])
def test_timeouts_as_backends_word_them(text, timeout) -> None:
    assert is_timeout_text(text) is timeout


@pytest.mark.parametrize("value, shown", [(0.96875, "0.9688"), (18732.4, "18732"), (420, "420"), (None, ""),
                                          ("done", "done"), (1e-5, "1e-05")])
def test_numbers(value, shown) -> None:
    assert number(value) == shown


@pytest.mark.parametrize("seconds, shown", [(4.123, "4.1 s"), (725, "12 min 05 s"), (11220, "3 h 07 min")])
def test_durations(seconds, shown) -> None:
    assert duration(seconds) == shown
