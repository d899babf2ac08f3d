"""runner.worker.stdio: a rank's sys.stdout and sys.stderr made anew, as `python -u` makes them, over descriptors 1
and 2 (in this process, over pipes; in a forked rank, compared with a real `python -u`: test_rank_process.py)."""

from __future__ import annotations

import io
import os
import sys

import pytest

from runner.worker import stdio

pytestmark = pytest.mark.unit


def test_a_stream_is_unbuffered_text_over_the_descriptor_as_python_u_makes_it() -> None:
    read, write = os.pipe()
    try:
        model = io.TextIOWrapper(io.BytesIO(), encoding="latin-1", errors="replace")
        stream = stdio._text_stream(write, "<stdout>", model, "strict")
        assert (stream.encoding, stream.errors, stream.line_buffering, stream.write_through) == \
            ("latin-1", "replace", False, True)
        assert (stream.name, stream.mode, stream.fileno(), type(stream.buffer).__name__) == \
            ("<stdout>", "w", write, "FileIO")
        stream.write("é\r\nno newline")  # written through at once, with no newline translation
        assert os.read(read, 100) == "é\r\nno newline".encode("latin-1")
        plain = stdio._text_stream(write, "<stderr>", None, "backslashreplace")
        assert (plain.encoding, plain.errors) == ("utf-8", "backslashreplace")  # no model: utf-8, the default handler
        stream.close()  # the descriptor stays open: it is the process's
        os.write(write, b"x")
    finally:
        os.close(read)
        os.close(write)


def test_the_standard_streams_are_replaced_with_the_interpreters_encoding(monkeypatch) -> None:
    for name in ("stdout", "stderr", "__stdout__", "__stderr__"):
        monkeypatch.setattr(sys, name, getattr(sys, name))  # put back after the test
    before = sys.__stdout__.encoding
    stdio.reopen_standard_streams()
    assert sys.stdout is sys.__stdout__ and sys.stderr is sys.__stderr__
    assert (sys.stdout.fileno(), sys.stderr.fileno(), sys.stdout.name, sys.stderr.name) == (1, 2, "<stdout>", "<stderr>")
    assert sys.stdout.encoding == before and sys.stderr.errors == "backslashreplace"
