"""README.md and the pages of docs/ as data for the tests that check them: each page's sections, fenced code blocks,
tables, inline code spans and links, each with its page, the section it is in (the heading it follows) and its line
number; and every page together (:class:`Docs`), so that a fact is checked wherever the text that states it lives,
and whatever a test enumerates (every bash block, every table, every link) covers every page."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"

_FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
_HEADING = re.compile(r"^(#{1,6}) (.+)$")
_SPAN = re.compile(r"`([^`]+)`")
_LINK = re.compile(r"\]\(([^)\s]+)\)")


@dataclass(frozen=True)
class Block:
    """A fenced code block: its language (``bash``, ``python``, ``yaml``, or ``""``) and its lines."""

    page: str
    section: str
    line: int  # of its first line of code (1-based)
    language: str
    lines: tuple[str, ...]


@dataclass(frozen=True)
class Table:
    """A table: its header's cells and its rows' cells (inline code keeps its backticks)."""

    page: str
    section: str
    line: int
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]

    def column(self, index: int) -> list[str]:
        return [row[index] for row in self.rows]


@dataclass(frozen=True)
class Span:
    """An inline code span outside the code blocks (its text may run over a line break, as Markdown allows), or a
    link's target."""

    page: str
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


def _section_text(text: str, heading: str) -> str | None:
    """The text of a section up to the next heading of any level; None where ``text`` has no such heading."""
    start = re.search(rf"^#+ {re.escape(heading)}$", text, re.M)
    if start is None:
        return None
    end = _HEADING.search(text, start.end() + 1)
    return text[start.end():end.start() if end else len(text)]


@dataclass(frozen=True)
class Page:
    """One Markdown file: ``name`` is its path in the checkout (``README.md``, ``docs/ssh.md``)."""

    name: str
    text: str
    headings: tuple[str, ...]
    blocks: tuple[Block, ...]
    tables: tuple[Table, ...]
    spans: tuple[Span, ...]
    links: tuple[Span, ...]  # relative link targets of [text](target)
    prose: str  # the text outside the code blocks

    def section(self, heading: str) -> str:
        """The text of a section up to the next heading of any level (``heading`` without its #s)."""
        found = _section_text(self.text, heading)
        assert found is not None, f"{self.name} has no section {heading!r}"
        return found


@dataclass(frozen=True)
class Docs:
    """Every page together: its blocks, tables, spans and links in page order, and its text joined."""

    pages: tuple[Page, ...]
    text: str
    blocks: tuple[Block, ...]
    tables: tuple[Table, ...]
    spans: tuple[Span, ...]
    links: tuple[Span, ...]
    prose: str

    @classmethod
    def of(cls, pages: tuple[Page, ...]) -> Docs:
        def every(kind: str) -> tuple:
            return tuple(item for page in pages for item in getattr(page, kind))

        return cls(pages, "\n\n".join(p.text for p in pages), every("blocks"), every("tables"), every("spans"),
                   every("links"), "\n\n".join(p.prose for p in pages))

    def page(self, name: str) -> Page:
        [found] = [p for p in self.pages if p.name == name]
        return found

    def page_with(self, heading: str) -> Page:
        """The one page that has a section ``heading``."""
        found = [p for p in self.pages if heading in p.headings]
        assert len(found) == 1, f"{len(found)} pages have a section {heading!r}: {[p.name for p in found]}"
        return found[0]

    def section(self, heading: str) -> str:
        """The text of a section, in whichever page holds it, up to the next heading of any level."""
        return self.page_with(heading).section(heading)

    def table(self, *header: str) -> Table:
        """The one table with exactly this header, in whichever page holds it."""
        found = [t for t in self.tables if t.header == header]
        assert len(found) == 1, f"README.md and docs/ have {len(found)} tables headed {header}"
        return found[0]


def parse(text: str, name: str = "README.md") -> Page:
    lines = text.splitlines()
    blocks, tables, prose_lines, headings = [], [], [], []
    section, fence, fence_start, fence_language, body = "", None, 0, "", []
    table_rows: list[tuple[int, str]] = []
    sections_by_line: list[str] = []

    def end_table() -> None:
        if len(table_rows) >= 2:
            line, head = table_rows[0]
            rows = tuple(cells(r) for _, r in table_rows[2:])
            tables.append(Table(name, sections_by_line[line - 1], line, cells(head), rows))
        table_rows.clear()

    for number, line in enumerate(lines, 1):
        if fence is not None:
            if _FENCE.match(line) and not _FENCE.match(line)[2]:
                blocks.append(Block(name, section, fence_start, fence_language, tuple(body)))
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
            headings.append(section)
        sections_by_line.append(section)
        prose_lines.append(line)
        if line.startswith("|"):
            table_rows.append((number, line))
        else:
            end_table()
    end_table()
    assert fence is None, f"{name}: a code block is not closed"
    prose = "\n".join(prose_lines)

    def located(pattern: re.Pattern[str]) -> tuple[Span, ...]:
        found = []
        for match in pattern.finditer(prose):
            line = prose.count("\n", 0, match.start()) + 1
            found.append(Span(name, sections_by_line[line - 1], line, match[1]))
        return tuple(found)

    spans = located(_SPAN)
    for span in spans:
        assert "\n\n" not in span.text, f"{name}:{span.line}: an unpaired backtick"
    return Page(name, text, tuple(headings), tuple(blocks), tuple(tables), spans, located(_LINK), prose)


def page_files() -> list[Path]:
    """README.md, then the pages of docs/ in name order (index.md, the site's home, among them)."""
    return [README, *sorted(DOCS.rglob("*.md"))]


@functools.cache
def docs() -> Docs:
    return Docs.of(tuple(parse(p.read_text(), str(p.relative_to(REPO))) for p in page_files()))
