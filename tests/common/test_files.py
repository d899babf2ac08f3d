"""runner.common.files: a file replaced whole, or left as it was."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from runner.common.files import replaced_atomically, write_atomically

pytestmark = pytest.mark.unit


def test_a_file_is_replaced_whole_and_no_temporary_file_is_left(tmp_path) -> None:
    path = tmp_path / "rank00000.done"
    write_atomically(path, '{"stopped": false}')
    write_atomically(path, b"\x00bytes")
    assert path.read_bytes() == b"\x00bytes" and os.listdir(tmp_path) == [path.name]
    write_atomically(path, "é", durable=True)  # text as UTF-8, data and rename on the disk
    assert path.read_text(encoding="utf-8") == "é" and os.listdir(tmp_path) == [path.name]


def test_a_writer_that_fails_leaves_the_old_file(tmp_path) -> None:
    path = tmp_path / "last.pt"
    path.write_text("the last good checkpoint")
    with pytest.raises(RuntimeError, match="disk full"), replaced_atomically(path, durable=True) as tmp:
        tmp.write_text("half a checkpo")
        assert tmp.parent == path.parent and tmp.name.startswith(".last.pt.")  # hidden, in the same folder
        # named by host, process and thread: no two writers share one, on this host or on another of a shared folder
        assert tmp.name == f".last.pt.{socket.gethostname()}.{os.getpid()}.{threading.get_ident()}.tmp"
        raise RuntimeError("disk full")
    assert path.read_text() == "the last good checkpoint" and os.listdir(tmp_path) == [path.name]
