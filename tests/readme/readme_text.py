"""README.md as data for the tests that check it: its sections, fenced code blocks, tables, inline code spans
and links, each with the section it is in (the heading it follows) and its line number."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"

_FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
_HEADING = re.compile(r"^(#{1,6}) (.+)$")
_SPAN = re.compile(r"`([^`]+)`")
_LINK = re.compile(r"\]\(([^)\s]+)\)")


@dataclass(frozen=True)
class Block:
    """A fenced code block: its language (``bash``, ``python``, ``yaml``, or ``""``) and its lines."""

    section: str
    line: int  # of its first line of code (1-based)
    language: str
    lines: tuple[str, ...]


@dataclass(frozen=True)
class Table:
    """A table: its header's cells and its rows' cells (inline code keeps its backticks)."""

    section: str
    line: int
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]

    def column(self, index: int) -> list[str]:
        return [row[index] for row in self.rows]


@dataclass(frozen=True)
class Span:
    """An inline code span outside the code blocks (its text may run over a line break, as Markdown allows)."""

    section: str
    line: int
    text: str


def cells(row: str) -> tuple[str, ...]:
    """A table row's cells: split at the pipes that are not inside inline code."""
    out, current, in_code = [], [], False
    for ch in row.strip()[1:-1]:
        if ch == "`":
            in_code = not in_code
        if ch == "|" and not in_code:
            out.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    out.append("".join(current).strip())
    return tuple(out)


def code_of(cell: str) -> list[str]:
    """The inline code of a table cell (or any text), in order."""
    return _SPAN.findall(cell)


@dataclass(frozen=True)
class Readme:
    text: str
    blocks: tuple[Block, ...]
    tables: tuple[Table, ...]
    spans: tuple[Span, ...]
    links: tuple[Span, ...]  # relative link targets of [text](target)
    prose: str  # the text outside the code blocks

    def section(self, heading: str) -> str:
        """The text of a section up to the next heading of any level (``heading`` without its #s)."""
        start = re.search(rf"^#+ {re.escape(heading)}$", self.text, re.M)
        assert start is not None, f"README.md has no section {heading!r}"
        end = _HEADING.search(self.text, start.end() + 1)
        return self.text[start.end():end.start() if end else len(self.text)]

    def table(self, *header: str) -> Table:
        """The one table with exactly this header."""
        found = [t for t in self.tables if t.header == header]
        assert len(found) == 1, f"README.md has {len(found)} tables headed {header}"
        return found[0]


def parse(text: str) -> Readme:
    lines = text.splitlines()
    blocks, tables, prose_lines = [], [], []
    section, fence, fence_start, fence_language, body = "", None, 0, "", []
    table_rows: list[tuple[int, str]] = []
    sections_by_line: list[str] = []

    def end_table() -> None:
        if len(table_rows) >= 2:
            line, head = table_rows[0]
            rows = tuple(cells(r) for _, r in table_rows[2:])
            tables.append(Table(sections_by_line[line - 1], line, cells(head), rows))
        table_rows.clear()

    for number, line in enumerate(lines, 1):
        if fence is not None:
            if _FENCE.match(line) and not _FENCE.match(line)[2]:
                blocks.append(Block(section, fence_start, fence_language, tuple(body)))
                fence = None
            else:
                body.append(line[len(fence):] if line.startswith(fence) else line.lstrip())
            sections_by_line.append(section)
            prose_lines.append("")
            continue
        if match := _FENCE.match(line):
            end_table()
            fence, fence_start, fence_language, body = match[1], number + 1, match[2], []
            sections_by_line.append(section)
            prose_lines.append("")
            continue
        if match := _HEADING.match(line):
            section = match[2]
        sections_by_line.append(section)
        prose_lines.append(line)
        if line.startswith("|"):
            table_rows.append((number, line))
        else:
            end_table()
    end_table()
    assert fence is None, "README.md: a code block is not closed"
    prose = "\n".join(prose_lines)

    def located(pattern: re.Pattern[str]) -> tuple[Span, ...]:
        found = []
        for match in pattern.finditer(prose):
            line = prose.count("\n", 0, match.start()) + 1
            found.append(Span(sections_by_line[line - 1], line, match[1]))
        return tuple(found)

    spans = located(_SPAN)
    for span in spans:
        assert "\n\n" not in span.text, f"README.md:{span.line}: an unpaired backtick"
    return Readme(text, tuple(blocks), tuple(tables), spans, located(_LINK), prose)


@functools.cache
def readme() -> Readme:
    return parse(README.read_text())
