"""Whether an error is a timeout: gloo, NCCL and the c10d stores all word theirs so."""

from __future__ import annotations


def is_timeout_text(text: str) -> bool:
    """An error's text says it timed out."""
    text = text.lower()
    return "timed out" in text or "timeout" in text
