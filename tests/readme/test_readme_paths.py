"""Every path into this checkout that README.md and docs/ name (inline code, code blocks, links) exists, every module it
names imports (and has the attribute it names), every link to a section finds its heading, and the modules of the
test bed it lists are scripts/bed/'s. The files of a run folder are checked against the code that names them in
test_readme_run_folder.py."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import torch

from conftest import REPO
from readme_text import DOCS, Span, docs

pytestmark = pytest.mark.docs

TOP = ("runner", "tests", "conf", "scripts", "benchmarks", "examples", "recipes", "hydra_plugins")
_PATH = re.compile(rf"(?<![\w./$<-])((?:{'|'.join(TOP)}|torch)/[\w./*<>-]*)")
_MODULE = re.compile(r"(?<![\w./-])((?:runner|hydra_plugins)(?:\.\w+)+(?::\w+)?)")
# Paths the README names in a user's repository, not this one: path -> why.
USERS = {"tests/test_digits.py": "the test of the user's own (\"tests/test_digits.py in your repository\")"}


def _texts() -> list[tuple[str, str]]:
    """(where, text) of every inline code span, code block line and link target."""
    found = [(f"{s.page}:{s.line}", s.text) for s in (*docs().spans, *docs().links)]
    for block in docs().blocks:
        found += [(f"{block.page}:{block.line + i}", line) for i, line in enumerate(block.lines)]
    return found


def named_paths() -> dict[str, str]:
    """Every path into the checkout (or into torch) the README names -> where it first does."""
    found: dict[str, str] = {}
    for where, text in _texts():
        for path in _PATH.findall(text):
            found.setdefault(path.rstrip("."), where)
    return found


def named_modules() -> dict[str, str]:
    found: dict[str, str] = {}
    for where, text in _texts():
        for name in _MODULE.findall(text):
            if not name.endswith(".py"):  # `runner.py`: a file of the user's that cannot shadow the runner
                found.setdefault(name, where)
    return found


PATHS = named_paths()
MODULES = named_modules()


def test_the_readme_names_paths_and_modules() -> None:
    assert len(PATHS) >= 50 and len(MODULES) >= 5, (PATHS, MODULES)
    assert set(USERS) <= set(PATHS), "USERS names a path the README no longer does"


@pytest.mark.parametrize("path", sorted(PATHS))
def test_every_path_exists(path: str) -> None:
    """A path with a placeholder (`conf/launcher/<name>.yaml`) or a glob names at least one file."""
    if path in USERS:
        return
    root = Path(torch.__file__).parent.parent if path.startswith("torch/") else REPO
    pattern = re.sub(r"<[^>]*>", "*", path).rstrip("/")
    found = list(root.glob(pattern)) if "*" in pattern else [root / pattern] if (root / pattern).exists() else []
    assert found, f"{PATHS[path]}: `{path}` names nothing in {root}"
    if path.endswith("/"):
        assert any(p.is_dir() for p in found), f"{PATHS[path]}: `{path}` is not a folder"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_module_imports_with_what_it_names(name: str) -> None:
    """`runner.worker.channel`, `runner.launchers.LAUNCHERS`, `runner.recipes.digits:main`: the longest prefix that
    is a module imports, and the rest are attributes of it."""
    dotted = name.replace(":", ".")
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            assert hasattr(found, attribute), f"{MODULES[name]}: `{name}`: {found.__name__} has no {attribute}"
            found = getattr(found, attribute)
        return
    pytest.fail(f"{MODULES[name]}: `{name}` does not import")


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def _target(link: Span) -> tuple[Path, str]:
    """The file a link leads to (from its page's folder; the page itself for ``#anchor``) and the anchor, if any."""
    path, _, anchor = link.text.partition("#")
    page = REPO / link.page
    return ((page.parent / path).resolve() if path else page), anchor


def test_every_link_finds_its_target() -> None:
    """A link leads to a file of the checkout, and its anchor to a heading of that page (GitHub's anchors, which are
    MkDocs's for these headings: test_docs_site.py builds the site, which checks its own); a page of docs/ links only
    to pages of docs/, as the site holds nothing else."""
    pages = {REPO / p.name: p for p in docs().pages}
    checked = 0
    for link in docs().links:
        if link.text.startswith(("http://", "https://")):
            continue
        where, (target, anchor) = f"{link.page}:{link.line}", _target(link)
        assert target.exists(), f"{where}: the link {link.text} leads nowhere"
        if link.page.startswith("docs/"):
            assert target.is_relative_to(DOCS) and target.suffix == ".md", \
                f"{where}: the link {link.text} leaves docs/, which is all the site has"
        if anchor:
            assert target in pages, f"{where}: the link {link.text} has an anchor into a file that is no page"
            assert anchor in {_anchor(h) for h in pages[target].headings}, \
                f"{where}: {pages[target].name} has no section of the anchor #{anchor}"
        checked += 1
    assert checked >= 40


# Modules of scripts/bed/ that are no part of the bed: name -> why the Layout's list leaves them out.
BED_HELPERS = {"common": "what every part uses (its error, messages, running a command, the lock)"}


def test_the_test_beds_parts_are_its_modules() -> None:
    """Layout: "`bed/`, one module per part: layout, network, ...": every module of scripts/bed/ but its helpers."""
    listed = re.search(r"`bed/`, one module per part: ([\w, ]+)\)", " ".join(docs().text.split()))
    assert listed is not None
    modules = {p.stem for p in (REPO / "scripts" / "bed").glob("*.py")} - {"__init__"}
    assert set(BED_HELPERS) <= modules
    assert sorted(listed[1].split(", ")) == sorted(modules - set(BED_HELPERS))
