"""c10d's repeated warnings said once (runner.worker.said_once), in a real process whose descriptor 2 the filter takes
over: the same warning at every retry (its log head differs) passes once, other lines pass as they are."""

from __future__ import annotations

import subprocess
import sys

import pytest

from runner.worker.said_once import words_of


RETRY = "[W1127 15:17:5{n}.362479984 socket.cpp:764] [c10d] The IPv6 network addresses of (box1, 27294) cannot be " \
        "retrieved (gai error: -3 - Temporary failure in name resolution)."


@pytest.mark.unit
def test_a_warnings_words_are_the_line_without_its_log_head() -> None:
    assert words_of(RETRY.format(n=5).encode()) == words_of(RETRY.format(n=6).encode()) == (
        b"[c10d] The IPv6 network addresses of (box1, 27294) cannot be retrieved (gai error: -3 - Temporary failure "
        b"in name resolution).")
    assert words_of(b"Traceback (most recent call last):\n") == b"Traceback (most recent call last):"


def test_each_warning_reaches_stderr_once_and_every_other_line_as_written() -> None:
    program = f"""
import os, sys, time
from runner.worker.said_once import say_each_once
thread = say_each_once()
for n in range(5):
    os.write(2, ({RETRY!r}.format(n=n) + "\\n").encode())  # as torch's C++ writes: to the descriptor
os.write(2, b"error: something else\\n")
os.write(2, {RETRY!r}.format(n=9).encode() + b"\\n")
os.write(2, b"error: something else\\n")  # (said twice: the same words; once is enough)
os.close(2)
thread.join(10)
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr == RETRY.format(n=0) + "\n" + "error: something else\n"


LOST = """[W1127 18:42:29.179350605 TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(fd=6, addr=[::1]:64875, remote=[::1]:4886): Connection reset by peer
Exception raised from recvBytes at /__w/pytorch/pytorch/torch/csrc/distributed/c10d/Utils.hpp:784 (most recent call first):
frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x9d (0x7efe4bfa9b8d in libc10.so)
frame #1: c10d::TCPStore::check(std::vector<std::string> const&) + 0x383 (0x7efe3c1 in libtorch_cpu.so)
<omitting python frames>
frame #21: _start + 0x21 (0x5560ee6d6081 in python)

"""


def test_a_lost_stores_cpp_backtrace_is_dropped_and_its_warning_kept() -> None:
    program = f"""
import os
from runner.worker.said_once import say_each_once
thread = say_each_once()
os.write(2, {LOST!r}.encode())
os.write(2, b"error: the store is gone\\n")
os.close(2)
thread.join(10)
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr == LOST.splitlines()[0] + "\nerror: the store is gone\n"
