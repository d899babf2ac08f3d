"""runner.worker.channel_proxy: the job's channel for a host agent that imports no torch, through a child of the
zygote that holds the TCPStore client (a real store, served by another child of the zygote)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from runner.worker.channel import ChannelError, ChannelInterrupted, JobChannel
from runner.worker.channel_proxy import ProxyError, ProxyKeyValue
from runner.worker.channel_records import JobFailure
from runner.worker.store_server import serve_from_zygote


def _store(zygote):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    port = sock.getsockname()[1]
    return serve_from_zygote(zygote, "127.0.0.1", sock.detach(), port, 10)


def test_the_channel_through_the_zygote_reads_and_writes_host_0s_store(zygote) -> None:
    store = _store(zygote)
    try:
        proxy = ProxyKeyValue.reach(zygote, "127.0.0.1", store.port, 10)
        channel = JobChannel(proxy)
        channel.open_attempt(2)
        channel.say_failed(2, JobFailure(rank=1, host="b", text="boom"))
        channel.say_failed(2, JobFailure(rank=3, host="c", text="later"))  # the first failure stays the first
        assert channel.attempt() == 2 and channel.failure(2).rank == 1 and channel.stop_requested() is None
        helper = psutil.Process(proxy._pid)
        assert helper.ppid() == zygote.process.pid
        channel.close()
        assert not helper.is_running() or helper.status() == psutil.STATUS_ZOMBIE
        with pytest.raises(ProxyError):
            proxy.get("runner/attempt")
    finally:
        store.stop()


def test_the_wait_for_a_store_not_there_yet_is_given_up_as_soon_as_the_agent_is_stopping(zygote) -> None:
    """A host whose share is told to stop (SIGTERM, the job ended) while host 0's store is not up: it stops waiting
    within a look, not after init.timeout_s, and its client child is gone."""
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    asked = []
    began = time.monotonic()
    with pytest.raises(ChannelInterrupted, match=f"stopped while waiting for host 0's store at 127.0.0.1:{port}"):
        ProxyKeyValue.reach(zygote, "127.0.0.1", port, 300, interrupted=lambda: asked.append(1) or len(asked) > 3)
    assert len(asked) == 4 and time.monotonic() - began < 30
    assert not [c for c in psutil.Process(zygote.process.pid).children() if c.status() != psutil.STATUS_ZOMBIE]


def test_a_store_that_is_not_there_is_said_so_and_one_that_goes_away_reads_as_empty(zygote) -> None:
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    with pytest.raises(ChannelError, match=f"host 0's store at 127.0.0.1:{port} cannot be reached"):
        ProxyKeyValue.reach(zygote, "127.0.0.1", port, 1)
    store = _store(zygote)
    channel = JobChannel(ProxyKeyValue.reach(zygote, "127.0.0.1", store.port, 10))
    store.stop()
    assert channel.attempt() is None and channel.failure(0) is None  # the channel's reading of a store gone
    channel.close()


def test_an_agent_that_uses_the_channel_imports_no_torch(tmp_path) -> None:
    code = textwrap.dedent("""
        import json, socket, sys
        from runner.worker.channel import JobChannel
        from runner.worker.channel_proxy import ProxyKeyValue
        from runner.worker.store_server import serve_from_zygote
        from runner.worker.zygote import Zygote
        zygote = Zygote.start()
        sock = socket.socket(); sock.bind(("127.0.0.1", 0)); sock.listen(4); port = sock.getsockname()[1]
        store = serve_from_zygote(zygote, "127.0.0.1", sock.detach(), port, 10)
        channel = JobChannel(ProxyKeyValue.reach(zygote, "127.0.0.1", port, 10))
        channel.open_attempt(0)
        print(json.dumps([channel.attempt(), "torch" in sys.modules]))
        channel.close(); store.stop(); zygote.close()
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [0, False]
