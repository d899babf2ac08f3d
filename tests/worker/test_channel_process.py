"""runner.worker.channel_process: the agent's client of host 0's store, in a real process of its own (as the zygote
forks it): it says ("ok", None) once connected and answers each call over the zygote's wire; a store that is not
there is said as an error."""

from __future__ import annotations

import datetime
import socket
import subprocess
import sys
import textwrap


from runner.worker.channel import PREFIX
from runner.worker.zygote_wire import receive, send

# not marked unit: each test starts a Python interpreter


def _client(port: int, theirs: socket.socket) -> subprocess.Popen:
    program = textwrap.dedent(f"""
        import os
        from runner.worker.channel_process import serve
        serve({theirs.fileno()}, "127.0.0.1", {port}, 5.0, os.getppid())
    """)
    return subprocess.Popen([sys.executable, "-c", program], pass_fds=(theirs.fileno(),))


def test_it_answers_the_agents_calls_on_host_0s_store() -> None:
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=10), wait_for_workers=False)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    proc = _client(server.port, theirs)
    theirs.close()
    try:
        assert receive(ours)[0] == ("ok", None)
        send(ours, ("set", ("runner/attempt", b"2")))
        assert receive(ours)[0] == ("ok", None)
        send(ours, ("get", ("runner/attempt",)))
        assert receive(ours)[0] == ("ok", b"2") and server.get(PREFIX + "runner/attempt") == b"2"  # the real store
        ours.close()  # the agent closes the channel: the client ends
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()


def test_a_store_that_is_not_there_is_said_as_an_error() -> None:
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    proc = _client(port, theirs)
    theirs.close()
    try:
        (said, why), _ = receive(ours)
        assert said == "error" and f"host 0's store at 127.0.0.1:{port} cannot be reached" in why
        assert proc.wait(timeout=30) == 1
    finally:
        ours.close()
        proc.kill()
        proc.wait()
