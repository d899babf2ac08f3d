"""The run folder's JSON-lines records (membership.jsonl, logs/hangs.jsonl): one JSON document a line, appended
whole, read back in order."""

from __future__ import annotations

import json
from pathlib import Path


def append_document(path: Path, document: object) -> None:
    """Add ``document`` to ``path`` as one line (its keys sorted)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(document, sort_keys=True) + "\n")


def documents(path: Path) -> list[object]:
    """The documents of ``path``, in order: none where it is not there, and a line that is not JSON (one being
    written) passed over."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found
