"""A test's body in a forked child of the test's process (for code that ends its process: os._exit, a signal to
itself), with what it wrote on its stderr."""

from __future__ import annotations

import os
import sys
import threading
import traceback
from collections.abc import Callable

CHILD_S = 5.0  # a forked child ends by then whatever happens (exit 97)


def in_child(body: Callable[[], None]) -> tuple[int, str]:
    """``body`` in a forked child of this process, its stderr (descriptor 2 and sys.stderr) a pipe: its exit status
    and what it wrote there. The child always ends with os._exit: its own, 99 after ``body`` returns, 98 if it
    raised, 97 after CHILD_S."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nothing of pytest's runs here
        try:
            os.close(read)
            os.dup2(write, 2)
            sys.stderr = open(2, "w", closefd=False)
            sys.stdout = open(os.devnull, "w")  # (pytest's, copied: never flushed twice)
            threading.Timer(CHILD_S, os._exit, (97,)).start()
            body()
            os._exit(99)
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(98)
    os.close(write)
    with open(read, "rb") as said:  # to the child's end: its exit closes the pipe
        text = said.read().decode()
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), text
