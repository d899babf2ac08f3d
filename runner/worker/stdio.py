"""A rank's standard streams, made the way a fresh interpreter started as torchrun starts its workers makes them.

torchrun runs each worker as ``python -u script.py``: file descriptors 1 and 2 are whatever it gave the process
(its terminal, or files with ``--redirects``), and ``sys.stdout``/``sys.stderr`` are plain unbuffered text files
over them. A rank here is forked from its host's zygote, which has torch imported already (the speed of `run`), so
it inherits the zygote's Python stream objects: :func:`reopen_standard_streams` replaces them, after descriptors 1
and 2 were pointed at the rank's pipes, with what ``python -u`` would have made: a
``TextIOWrapper`` over an unbuffered ``FileIO`` named ``<stdout>``/``<stderr>``, write-through, with the
interpreter's encoding and error handlers. Everything a script may do with them (``fileno()``, ``buffer``,
``reconfigure``, ``faulthandler.enable()``, C-level writes, subprocesses) then behaves as under torchrun.
"""

from __future__ import annotations

import io
import sys
from typing import TextIO


def _text_stream(fd: int, name: str, model: TextIO | None, default_errors: str) -> io.TextIOWrapper:
    raw = io.FileIO(fd, "w", closefd=False)
    raw.name = name  # type: ignore[misc]  # as CPython names the raw file of a standard stream
    encoding = getattr(model, "encoding", None) or "utf-8"
    errors = getattr(model, "errors", None) or default_errors
    # CPython's create_stdio under -u: no buffer, the text layer writes through, newline "\n"
    stream = io.TextIOWrapper(raw, encoding=encoding, errors=errors, newline="\n", line_buffering=False,
                              write_through=True)
    stream.mode = "w"  # type: ignore[misc]
    return stream


def reopen_standard_streams() -> None:
    """``sys.stdout``, ``sys.stderr`` (and their ``__stdout__``/``__stderr__``) anew over descriptors 1 and 2, as
    ``python -u`` makes them; the encoding and error handlers are those this interpreter chose for its own (the
    same locale and ``PYTHONIOENCODING`` a fresh worker would see)."""
    out = _text_stream(1, "<stdout>", sys.__stdout__, "strict")
    err = _text_stream(2, "<stderr>", sys.__stderr__, "backslashreplace")
    sys.stdout = sys.__stdout__ = out  # type: ignore[misc]
    sys.stderr = sys.__stderr__ = err  # type: ignore[misc]
