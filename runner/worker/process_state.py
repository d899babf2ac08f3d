"""What a process of this host is doing, read from Linux's ``/proc`` by its host agent without asking it: its CPU
time, and what its main thread waits for. A rank that answers nothing (its watch cannot run: the GIL is held by a
thread stuck in native code) is described from here, as gdb would show it in a word: "its main thread waits for its
thread pt_gloo_runloop to end (ProcessGroupGloo's destructor), which waits on a lock".

A thread's system call (``/proc/<pid>/task/<tid>/syscall``: its number and arguments) tells a join from other waits:
glibc's ``pthread_join`` waits on a futex whose expected value is the joined thread's id. Reading it needs the right to
trace the process (its parent's ancestors have it, as root has); where it is refused, the kernel's wait channel
(``wchan``) says less."""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Syscalls:
    """One architecture's system call numbers of the waits worth naming (each has its own table: the numbers of one
    name other calls on the other)."""

    futex: frozenset[int]
    sleeps: frozenset[int]
    io: frozenset[int]
    pause: frozenset[int]


SYSCALLS = {
    "x86_64": Syscalls(futex=frozenset({202}),
                       sleeps=frozenset({35, 230}),  # nanosleep, clock_nanosleep
                       # read, poll, select, recvfrom, epoll_wait, pselect6, ppoll, epoll_pwait
                       io=frozenset({0, 7, 23, 45, 232, 270, 271, 281}),
                       pause=frozenset({34, 130})),  # pause, rt_sigsuspend
    "aarch64": Syscalls(futex=frozenset({98}),
                        sleeps=frozenset({101, 115}),  # nanosleep, clock_nanosleep
                        io=frozenset({22, 63, 72, 73, 207}),  # epoll_pwait, read, pselect6, ppoll, recvfrom
                        pause=frozenset({133})),  # rt_sigsuspend (no pause on aarch64)
}
NO_SYSCALLS = Syscalls(frozenset(), frozenset(), frozenset(), frozenset())  # elsewhere: the wait channel says it


def this_machines() -> Syscalls:
    """The table of this machine's architecture (platform.machine())."""
    return SYSCALLS.get(platform.machine(), NO_SYSCALLS)
# torch's threads, by the names it gives them, and the destructor that joins each
_JOINED_IN = {"pt_gloo_runloop": "ProcessGroupGloo's destructor", "pt_nccl_watchdg": "ProcessGroupNCCL's destructor",
              "pt_nccl_heartbt": "ProcessGroupNCCL's destructor", "pt_tcpstore_uv": "TCPStore's destructor"}


@dataclass(frozen=True)
class ThreadState:
    tid: int
    name: str
    state: str  # R running, S sleeping, D in the kernel uninterruptibly, ...
    syscall: int | None  # the system call it waits in (None: running, or not to be read)
    args: tuple[int, ...] = ()
    wchan: str = ""


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def main_thread_cpu_seconds(pid: int) -> float | None:
    """The CPU time the process's main thread has used (user and system); None when it is gone. (Not the whole
    process's: threads waiting for the GIL wake every few milliseconds to ask for it, and use a little.)"""
    stat = _read(f"/proc/{pid}/task/{pid}/stat")
    if stat is None:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def threads(pid: int) -> list[ThreadState]:
    """Every thread of the process, its main thread first; [] when it is gone."""
    try:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return []
    found = []
    for tid in sorted(tids, key=lambda t: t != pid):
        base = f"/proc/{pid}/task/{tid}"
        stat = _read(f"{base}/stat")
        if stat is None:
            continue
        state = stat.rsplit(")", 1)[1].split()[0]
        name = (_read(f"{base}/comm") or "").strip()
        syscall, args = _syscall(_read(f"{base}/syscall"))
        found.append(ThreadState(tid, name, state, syscall, args, (_read(f"{base}/wchan") or "").strip()))
    return found


def _syscall(text: str | None) -> tuple[int | None, tuple[int, ...]]:
    """``202 0x7f3c37fff990 0x109 0xe01 ...``: the call and its arguments; (None, ()) when running or unreadable."""
    if not text or text.startswith("running"):
        return None, ()
    parts = text.split()
    try:
        number = int(parts[0])
        return (number if number >= 0 else None), tuple(int(a, 16) for a in parts[1:7])
    except (ValueError, IndexError):
        return None, ()


@dataclass(frozen=True)
class Waiting:
    """What a process's main thread is doing: ``detail`` in words ("its main thread waits for its thread
    pt_gloo_runloop to end, which waits on a lock"), and ``place``, the code that does it where the threads tell it
    ("ProcessGroupGloo's destructor"), else None."""

    detail: str
    place: str | None = None


LOOKS = 20  # a thread waiting for the GIL wakes every 5 ms to ask for it: of this many looks, 10 ms apart, one that
LOOK_GAP_S = 0.01  # finds every thread waiting is the one said (a stuck rank's description takes 0.2 s at most)


def what_it_waits_for(pid: int) -> Waiting:
    """What the process's main thread is doing (an empty detail when nothing can be read)."""
    said = describe(threads(pid))
    for _ in range(LOOKS - 1):
        if not said.detail.endswith("runs"):
            break
        time.sleep(LOOK_GAP_S)
        said = describe(threads(pid))
    return said


def describe(states: list[ThreadState], calls: Syscalls | None = None) -> Waiting:
    """``calls``: the system call numbers of the machine the threads ran on (default: this one's)."""
    if not states:
        return Waiting("")
    calls = calls if calls is not None else this_machines()
    main, others = states[0], {t.tid: t for t in states[1:]}
    joined = others.get(main.args[2]) if main.syscall in calls.futex and len(main.args) > 2 else None
    if joined is not None:
        return Waiting(f"its main thread waits for its thread {joined.name or joined.tid} to end, which "
                       f"{_doing(joined, calls)}", _JOINED_IN.get(joined.name))
    return Waiting(f"its main thread {_doing(main, calls)}")


def _doing(t: ThreadState, calls: Syscalls) -> str:
    if t.syscall in calls.futex or (t.syscall is None and "futex" in t.wchan):
        return "waits on a lock"
    if t.syscall in calls.sleeps or "nanosleep" in t.wchan:
        return "sleeps"
    if t.syscall in calls.pause:
        return "waits for a signal"
    if t.syscall in calls.io or any(w in t.wchan for w in ("poll", "select", "pipe", "sk_wait", "tcp")):
        return "waits for input or a connection"
    if t.state == "D":
        return f"waits in the kernel ({t.wchan or 'uninterruptibly'})"
    if t.state == "R" or (t.syscall is None and t.wchan in ("", "0")):
        return "runs"  # or caught between two system calls (woken, not yet running): what_it_waits_for looks again
    return f"waits in system call {t.syscall}" if t.syscall is not None else f"waits ({t.wchan or t.state})"
