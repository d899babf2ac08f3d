"""runner.common.exits: `run`'s exit statuses, and those of processes ended by a signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from runner.common import exits



@pytest.mark.unit
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
