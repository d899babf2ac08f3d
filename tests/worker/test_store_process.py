"""runner.worker.store_process: the store's process itself, in a real process of its own (as the zygote forks it):
it serves host 0's TCPStore on the listening socket it is given, says READY, dials itself over loopback whatever
address the job gives host 0 (a name this host cannot resolve included), and is deaf to the signals that stop a job."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap


from runner.worker.store_process import READY

# not marked unit: each test starts a Python interpreter


def test_it_serves_the_store_on_the_socket_given_and_outlives_a_jobs_stop_signals() -> None:
    import torch.distributed as dist

    sock = socket.socket()
    sock.bind(("0.0.0.0", 0))
    sock.listen(16)
    port = sock.getsockname()[1]
    ready_r, ready_w = os.pipe()
    program = textwrap.dedent(f"""
        import os
        from runner.worker.store_process import serve
        serve("no-such-host.invalid", {sock.fileno()}, {port}, 30.0, {ready_w}, os.getppid())
    """)
    # (its parent is this test, as the zygote is the real one's: it dies with it)
    proc = subprocess.Popen([sys.executable, "-c", program], pass_fds=(sock.fileno(), ready_w))
    sock.close()
    os.close(ready_w)
    try:
        said = b""
        while chunk := os.read(ready_r, 100):
            said += chunk
        assert said == READY
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
            proc.send_signal(signum)
        client = dist.TCPStore("127.0.0.1", port, None, False, wait_for_workers=False)
        client.set("k", b"v")
        assert client.get("k") == b"v" and proc.poll() is None
    finally:
        os.close(ready_r)
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
