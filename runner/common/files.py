"""Replacing a file whole: a reader sees the old file or the new one, never a part (the ranks' records are read while
other processes write them, on this host or, through a shared run folder, on another)."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _fsync(path: Path, flags: int = os.O_RDONLY) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_HOST = socket.gethostname().replace("/", "_") or "host"  # (a name is no path)


def temporary_host() -> str:
    """This machine's name as the temporary files of :func:`replaced_atomically` carry it."""
    return _HOST


@contextmanager
def replaced_atomically(path: Path, *, durable: bool = False) -> Iterator[Path]:
    """A temporary path to write ``path``'s new content to (torch.save writes to a path); on leaving, it replaces
    ``path`` (os.replace, atomic within a folder), and on an exception it is removed and ``path`` left as it was.

    The temporary file is a hidden one of the same folder (os.replace does not cross file systems), named by host,
    process and thread: the ranks' watch thread and main thread may write at once, and hosts that share the run
    folder (launcher=ssh over an NFS home) have processes of the same id. ``durable``: the data and the
    rename reach the disk before it returns (fsync of the file, then of its folder), for what must survive a node
    that goes down (a checkpoint a requeued job resumes from); the other records need only outlive their process.
    """
    tmp = path.with_name(f".{path.name}.{_HOST}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        yield tmp
        if durable:
            _fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        _fsync(path.parent, os.O_RDONLY | os.O_DIRECTORY)


def write_atomically(path: Path, data: str | bytes, *, durable: bool = False) -> None:
    """Replace ``path`` with ``data`` (text is written as UTF-8) in one step (:func:`replaced_atomically`)."""
    with replaced_atomically(path, durable=durable) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
