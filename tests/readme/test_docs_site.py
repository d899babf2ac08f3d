"""The documentation site (mkdocs.yml, docs/): its nav is every page of docs/, each once; README.md stays a front
page (200 lines at most, with the two commands of a fresh machine, linking every page); every heading names one
section of one page; and the site builds with `mkdocs build --strict`, in which a broken link or anchor is a warning
(mkdocs.yml's `validation:`) and so fails the build, as a broken anchor is shown to."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from readme_text import DOCS, README, REPO, docs

MKDOCS = REPO / "mkdocs.yml"
FRONT_PAGE_LINES = 200
# what .ci/run (through scripts/test.sh) and a new user type first: README's first block says them as they are
FIRST_COMMANDS = ("bash scripts/setup.sh && .venv/bin/run", "bash scripts/test.sh")


def _config() -> dict[str, Any]:
    return yaml.safe_load(MKDOCS.read_text())


def _nav_pages(nav: list[Any]) -> list[str]:
    """The pages of a nav, in its order: an entry is a page, ``{title: page}`` or ``{title: [entries]}``."""
    pages = []
    for entry in nav:
        for value in entry.values() if isinstance(entry, dict) else [entry]:
            pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


@pytest.mark.docs
def test_the_nav_is_every_page_of_docs_once() -> None:
    nav = _nav_pages(_config()["nav"])
    assert nav[0] == "index.md", "the site's home comes first"
    assert not [page for page, n in Counter(nav).items() if n > 1], nav
    on_disk = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(nav) == on_disk, (f"not in mkdocs.yml's nav: {sorted(set(on_disk) - set(nav))}; "
                                    f"in the nav, not in docs/: {sorted(set(nav) - set(on_disk))}")


@pytest.mark.docs
def test_the_readme_is_a_front_page_that_leads_to_every_page() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= FRONT_PAGE_LINES, f"README.md has {len(lines)} lines: move the detail to a page of docs/"
    first = docs().page("README.md").blocks[0]
    assert [line.split("#")[0].strip() for line in first.lines] == list(FIRST_COMMANDS)
    linked = {link.text.partition("#")[0] for link in docs().page("README.md").links}
    pages = {str(p.relative_to(REPO)) for p in DOCS.rglob("*.md")}
    assert pages <= linked, f"README.md links no page {sorted(pages - linked)}"


@pytest.mark.docs
def test_every_heading_names_one_section() -> None:
    """A section is found by its heading alone (Docs.section, the sections of FOLDERS): no heading is in two places."""
    headings = Counter(h for page in docs().pages for h in page.headings)
    assert not [h for h, n in headings.items() if n > 1], headings


@pytest.mark.docs
def test_the_site_is_built_with_every_link_and_anchor_checked() -> None:
    config = _config()
    assert config["validation"] == {"omitted_files": "warn", "links": {
        "not_found": "warn", "anchors": "warn", "absolute_links": "warn", "unrecognized_links": "warn"}}
    assert config["theme"]["name"] == "material" and "search" in config["plugins"]
    # what builds it is what scripts/setup.sh installs (the extra `test`), pinned: its warnings are the verdict
    test_extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    pinned = {r.split("==")[0] for r in test_extra if "==" in r}
    assert {"mkdocs", "mkdocs-material"} <= pinned, test_extra


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """`mkdocs build --strict` of ``config`` into ``site``, with the interpreter of the tests (the one setup.sh makes)."""
    if importlib.util.find_spec("mkdocs") is None:
        pytest.fail("mkdocs is not installed: scripts/setup.sh installs it (pyproject.toml's extra `test`)")
    # NO_MKDOCS_2_WARNING: mkdocs-material's notice of its end of life, printed at every build, is no warning of ours
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_the_site_builds_in_strict_mode(tmp_path) -> None:
    done = _build(MKDOCS, tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stdout + done.stderr, done.stdout + done.stderr
    for page in _nav_pages(_config()["nav"]):
        built = "index.html" if page == "index.md" else f"{page.removesuffix('.md')}/index.html"
        assert (tmp_path / "site" / built).is_file(), built


def test_a_broken_anchor_fails_the_build(tmp_path) -> None:
    """The check the site's build makes of its anchors, shown on a copy of the site with one link broken."""
    shutil.copy(MKDOCS, tmp_path / "mkdocs.yml")
    shutil.copytree(DOCS, tmp_path / "docs")
    with (tmp_path / "docs" / "sweeps.md").open("a") as page:
        page.write("\nSee [the ssh page](ssh.md#no-such-section).\n")
    done = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0, done.stdout + done.stderr
    assert "does not contain an anchor '#no-such-section'" in done.stdout + done.stderr, done.stdout + done.stderr
