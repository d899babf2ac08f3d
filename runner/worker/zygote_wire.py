"""The zygote's wire: a message (pickled) and the descriptors it carries (SCM_RIGHTS), on a Unix socket between the
agent and its zygote (runner.worker.zygote), or between the agent and a child of the zygote that serves it
(runner.worker.channel_process). A leaf: both ends import it, and it imports neither."""

from __future__ import annotations

import pickle
import socket
import struct
from collections.abc import Sequence

_HEADER = struct.Struct("!I")
_MAX_FDS = 8


def send(sock: socket.socket, message: object, fds: Sequence[int] = ()) -> None:
    """One message, and the descriptors it carries (duplicated into the receiver)."""
    payload = pickle.dumps(message)
    socket.send_fds(sock, [_HEADER.pack(len(payload))], list(fds))
    sock.sendall(payload)


def receive(sock: socket.socket) -> tuple[object, list[int]]:
    """The next message and its descriptors; raises EOFError when the other end has closed."""
    header, fds, _, _ = socket.recv_fds(sock, _HEADER.size, _MAX_FDS)
    if not header:
        raise EOFError
    header += _exactly(sock, _HEADER.size - len(header))
    (size,) = _HEADER.unpack(header)
    return pickle.loads(_exactly(sock, size)), list(fds)


def _exactly(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = sock.recv(size)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)
