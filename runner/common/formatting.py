"""Numbers and durations as the runner shows them, the same on every screen and table."""

from __future__ import annotations

from typing import Any


def number(value: Any) -> str:
    """A metric: whole numbers as they are, large floats without decimals, others to 4 significant digits;
    None as an empty cell."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.0f}" if abs(value) >= 1e4 else f"{value:.4g}"
    return str(value)


def duration(seconds: float) -> str:
    """``4.1 s``, ``12 min 05 s``, ``3 h 07 min``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    s = int(seconds)
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"
