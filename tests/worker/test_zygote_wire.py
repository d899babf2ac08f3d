"""runner.worker.zygote_wire: a message and the descriptors it carries, on a real Unix socket pair."""

from __future__ import annotations

import os
import socket

import pytest

from runner.worker.zygote_wire import receive, send

pytestmark = pytest.mark.unit


def test_a_message_arrives_whole_with_its_descriptors_and_a_closed_end_is_eof() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    read, write = os.pipe()
    try:
        big = {"argv": ["x" * 100_000], "n": 3}  # more than one recv
        send(ours, big, [write])
        got, fds = receive(theirs)
        assert got == big and len(fds) == 1 and fds[0] != write
        os.write(fds[0], b"through the passed descriptor")  # a duplicate of the pipe's writing end
        os.close(fds[0])
        assert os.read(read, 100) == b"through the passed descriptor"
        ours.close()
        with pytest.raises(EOFError):
            receive(theirs)
    finally:
        theirs.close()
        os.close(read)
        os.close(write)
