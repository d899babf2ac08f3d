"""runner.worker.process_state: a process described from /proc, without asking it: the main thread's CPU time, and
what it waits for, as a real process stuck the way ~ProcessGroupGloo leaves a rank (its main thread joins a thread that
waits for the GIL it holds) shows it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from runner.worker import process_state
from runner.worker.process_state import (NO_SYSCALLS, SYSCALLS, ThreadState, describe, main_thread_cpu_seconds,
                                          this_machines, threads, what_it_waits_for)
from runs import wait_until

# from pthread_create to pthread_join the main thread never lets the GIL go (calls of C functions alone, through
# ctypes.PyDLL: no print, no Python function, no loop between them), so the new thread waits for it from its start
STUCK = textwrap.dedent("""
    import ctypes
    libc = ctypes.PyDLL(None)  # calls with the GIL held
    body = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(lambda _arg: None)  # a thread that needs the GIL
    thread = ctypes.c_ulong()
    print("joining", flush=True)
    libc.pthread_create(ctypes.byref(thread), None, body, None)
    libc.pthread_setname_np(thread, b"pt_gloo_runloop")
    libc.pthread_join(thread, None)
""")


def test_a_process_stuck_joining_gloos_worker_while_it_holds_the_gil_is_described_as_that() -> None:
    proc = subprocess.Popen([sys.executable, "-c", STUCK], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "joining\n"
        wait_until(lambda: what_it_waits_for(proc.pid).place is not None, 30,
                   f"the main thread in its join: {threads(proc.pid)}")
        waiting = what_it_waits_for(proc.pid)
        assert waiting.place == "ProcessGroupGloo's destructor"
        assert waiting.detail == "its main thread waits for its thread pt_gloo_runloop to end, which waits on a lock"
        used = main_thread_cpu_seconds(proc.pid)
        assert used is not None and used < 5.0
    finally:
        proc.kill()
        proc.wait()
    assert main_thread_cpu_seconds(proc.pid) is None and threads(proc.pid) == []


@pytest.mark.unit
@pytest.mark.parametrize("main, said", [
    (ThreadState(1, "python", "S", 230, (0, 0, 0)), "its main thread sleeps"),
    (ThreadState(1, "python", "S", 7, (0, 0, 0)), "its main thread waits for input or a connection"),
    (ThreadState(1, "python", "S", 202, (0, 128, 99)), "its main thread waits on a lock"),  # 99: no thread of it
    (ThreadState(1, "python", "R", None), "its main thread runs"),
    # woken and not yet running: no system call, no wait channel (a stuck rank's gloo thread was read so once, and
    # said to wait "(0)"): runs, so that what_it_waits_for looks again
    (ThreadState(1, "python", "S", None, (), "0"), "its main thread runs"),
    (ThreadState(1, "python", "D", None, (), "nfs_wait"), "its main thread waits in the kernel (nfs_wait)"),
])
def test_what_a_main_thread_does_in_words(main, said) -> None:
    x86_64 = SYSCALLS["x86_64"]
    assert describe([main, ThreadState(2, "other", "S", 202, (0, 128, 0))], x86_64).detail == said


@pytest.mark.unit
@pytest.mark.parametrize("machine, calls", [("x86_64", (202, 35, 7, 130)), ("aarch64", (98, 101, 73, 133))])
def test_each_architecture_has_its_own_system_call_numbers(machine, calls) -> None:
    table = SYSCALLS[machine]
    said = [describe([ThreadState(1, "python", "S", n, (0, 0, 0))], table).detail for n in calls]
    assert said == ["its main thread waits on a lock", "its main thread sleeps",
                    "its main thread waits for input or a connection", "its main thread waits for a signal"]
    other = SYSCALLS["aarch64" if machine == "x86_64" else "x86_64"]
    assert describe([ThreadState(1, "python", "S", calls[3], (0, 0, 0))], other).detail != said[3]  # one table each


@pytest.mark.unit
def test_the_table_is_this_machines_architectures(monkeypatch) -> None:
    monkeypatch.setattr(process_state.platform, "machine", lambda: "aarch64")
    assert this_machines() is SYSCALLS["aarch64"]
    monkeypatch.setattr(process_state.platform, "machine", lambda: "riscv64")
    assert this_machines() is NO_SYSCALLS


@pytest.mark.unit
def test_a_join_of_a_thread_torch_did_not_name_says_no_place_and_nothing_read_says_nothing() -> None:
    joined = describe([ThreadState(1, "python", "S", 202, (0, 265, 2)), ThreadState(2, "worker", "R", None)],
                      SYSCALLS["x86_64"])
    assert (joined.place, joined.detail) == (None, "its main thread waits for its thread worker to end, which runs")
    assert describe([]).detail == ""
