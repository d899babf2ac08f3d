"""Numbers and durations as the runner shows them, the same on every screen and table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def number(value: Any) -> str:
    """A metric: whole numbers as they are, large floats without decimals, others to 4 significant digits;
    None as an empty cell."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.0f}" if abs(value) >= 1e4 else f"{value:.4g}"
    return str(value)


def rank_list(ranks: Sequence[int], shown: int, sep: str = ", ") -> str:
    """Ranks on one line: the first ``shown`` joined by ``sep``, then how many there are where there are more
    (``0, 1, ... (40)``; ``0,1,... (40)`` with ``sep=","``)."""
    return sep.join(map(str, ranks[:shown])) + (f"{sep}... ({len(ranks)})" if len(ranks) > shown else "")


def duration(seconds: float) -> str:
    """``4.1 s``, ``12 min 05 s``, ``3 h 07 min``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    s = int(seconds)
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def error_line(text: str, limit: int | None = 160) -> str:
    """The one line of an error's text that says what went wrong: the first line that says something, or, when
    the text carries a traceback of its own (torch.multiprocessing's ProcessRaisedException begins with a
    newline and a header), its last line, the innermost error; cut at ``limit`` characters between words,
    never inside a number ("Timed out waiting 300000ms", not "3000..."); ``limit`` None: the whole line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    line = lines[-1] if any(line.startswith("Traceback (most recent call last)") for line in lines) else lines[0]
    if line.endswith(":") and line == lines[0] and len(lines) > 1 and " " not in line:  # "RuntimeError:" and the
        line = f"{line} {lines[1]}"  # message on the lines below it (one that began with blank lines)
    if limit is None or len(line) <= limit:
        return line
    cut = line[:limit - 1].rsplit(" ", 1)[0] if " " in line[:limit - 1] else line[:limit - 1]
    return cut.rstrip(" ,;:") + "…"
