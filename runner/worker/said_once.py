"""Each of c10d's warnings said once, in the processes of the rendezvous (host 0's store, a host agent's channel
client), whose stderr is the job's terminal.

torch's TCPStore logs the same warning again at every retry and for every peer (``[W1127 15:22:34.053547963
socket.cpp:764] [c10d] The IPv6 network addresses of (box1, 21738) cannot be retrieved``, ``The hostname of the client
socket cannot be retrieved``, a refused connection while host 0 is not up yet): dozens of lines that repeat one cause.
:func:`say_each_once` puts a pipe in front of the process's descriptor 2 and a thread that passes on each line whose
words (its head of time and source line cut off) it has not passed on before. For a process that forks nothing
(the store's, the channel's: children of the zygote that stay leaves); never a rank's, whose stderr is the script's.

A lost host makes each of these print, with its one-line warning (``[c10d] recvValue failed on SocketImpl(...):
Connection reset by peer``), the C++ backtrace of the exception behind it (``Exception raised from recvBytes at
...``, ``frame #3: ...``): torch's internals, the same for every such loss, which the warning's line already says in
words. Those lines, and blank ones, are dropped too.
"""

from __future__ import annotations

import os
import re
import threading

# glog's head: severity, date, time, thread, file:line
_HEAD = re.compile(rb"^\[?[IWEF]\d{4} [\d:.]+\s+(?:\d+\s+)?[\w.]+:\d+\]\s*")
# a C++ exception's backtrace, as c10d prints it under its warning
_BACKTRACE = re.compile(rb"^(Exception raised from \S+ at \S+ \(most recent call first\):|frame #\d+: |"
                        rb"<omitting python frames>)")


def words_of(line: bytes) -> bytes:
    """A line without its log head: what makes two lines the same warning."""
    return _HEAD.sub(b"", line.strip())


def say_each_once(fd: int = 2) -> threading.Thread:
    """From now on, what this process writes to ``fd`` passes through a thread that drops repeated lines (the module
    docstring); the thread, a daemon, ends when the process does."""
    out = os.dup(fd)
    read, write = os.pipe()
    os.dup2(write, fd)
    os.close(write)
    thread = threading.Thread(target=_pass_on, args=(read, out), name="runner-said-once", daemon=True)
    thread.start()
    return thread


def _pass_on(read: int, out: int) -> None:
    seen: set[bytes] = set()
    with os.fdopen(read, "rb") as lines:
        for line in lines:
            words = words_of(line)
            if not words or words in seen or _BACKTRACE.match(words):
                continue
            seen.add(words)
            try:
                os.write(out, line)
            except OSError:
                pass
