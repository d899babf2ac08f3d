"""Every path into this checkout that README.md names (inline code, code blocks, links) exists, every module it
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
from readme_text import readme

pytestmark = pytest.mark.unit

TOP = ("runner", "tests", "conf", "scripts", "benchmarks", "examples", "recipes", "hydra_plugins")
_PATH = re.compile(rf"(?<![\w./$<-])((?:{'|'.join(TOP)}|torch)/[\w./*<>-]*)")
_MODULE = re.compile(r"(?<![\w./-])((?:runner|hydra_plugins)(?:\.\w+)+(?::\w+)?)")
# Paths the README names in a user's repository, not this one: path -> why.
USERS = {"tests/test_digits.py": "the test of the user's own (\"tests/test_digits.py in your repository\")"}


def _texts() -> list[tuple[str, str]]:
    """(where, text) of every inline code span, code block line and link target."""
    found = [(f"README.md:{s.line}", s.text) for s in (*readme().spans, *readme().links)]
    for block in readme().blocks:
        found += [(f"README.md:{block.line + i}", line) for i, line in enumerate(block.lines)]
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


def test_every_link_finds_its_target() -> None:
    anchors = {_anchor(m) for m in re.findall(r"^#+ (.+)$", readme().prose, re.M)}
    for link in readme().links:
        if link.text.startswith("#"):
            assert link.text[1:] in anchors, f"README.md:{link.line}: no section has the anchor {link.text}"
        elif not link.text.startswith(("http://", "https://")):
            assert (REPO / link.text).exists(), f"README.md:{link.line}: the link {link.text} leads nowhere"


# Modules of scripts/bed/ that are no part of the bed: name -> why the Layout's list leaves them out.
BED_HELPERS = {"common": "what every part uses (its error, messages, running a command, the lock)"}


def test_the_test_beds_parts_are_its_modules() -> None:
    """Layout: "`bed/`, one module per part: layout, network, ...": every module of scripts/bed/ but its helpers."""
    listed = re.search(r"`bed/`, one module per part: ([\w, ]+)\)", " ".join(readme().text.split()))
    assert listed is not None
    modules = {p.stem for p in (REPO / "scripts" / "bed").glob("*.py")} - {"__init__"}
    assert set(BED_HELPERS) <= modules
    assert sorted(listed[1].split(", ")) == sorted(modules - set(BED_HELPERS))
