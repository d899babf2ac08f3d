"""docs/architecture.md: `tests/` mirrors the package: each module of runner/ has a test module of its name in the folder of its
layer (runner/<layer>/<module>.py: tests/<layer>/test_<module>.py). Where two layers have a module of one name,
the test module adds the layer's kind (launchers/mpi.py: test_mpi_launcher.py, environments/mpi.py:
test_mpi_environment.py), as pytest needs test files of distinct names."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.unit

# re-exports with no logic of their own: tested through what uses them (the recipes use runner.api)
FACES = {"runner/api.py"}

# modules with no test module of their name yet, tested only through others (the list may only shrink)
NOT_YET: set[str] = set()


def mirrors(module: Path) -> list[Path]:
    """Where the test module of ``module`` (relative to the checkout) may be."""
    layer = module.parent.relative_to("runner")
    kind = layer.parts[-1].removesuffix("s") if layer.parts else ""
    names = [f"test_{module.stem}.py"] + ([f"test_{module.stem}_{kind}.py"] if kind else [])
    return [REPO / "tests" / layer / name for name in names]


def test_every_runner_module_has_a_test_module_of_its_name() -> None:
    modules = sorted(p.relative_to(REPO) for p in (REPO / "runner").rglob("*.py") if p.name != "__init__.py")
    assert len(modules) > 50 and not (FACES | NOT_YET) - {str(m) for m in modules}  # the lists name real modules
    missing = {str(m) for m in modules if str(m) not in FACES and not any(t.is_file() for t in mirrors(m))}
    assert missing <= NOT_YET, f"modules without a test module: {sorted(missing - NOT_YET)} (tests/<layer>/test_<module>.py)"
    assert NOT_YET <= missing, f"these have their test module now: take them off NOT_YET: {sorted(NOT_YET - missing)}"


def test_test_file_names_are_distinct() -> None:
    """pytest (rootdir imports, no __init__.py) cannot collect two test files of one name in different folders."""
    names = [p.name for p in (REPO / "tests").rglob("test_*.py")]
    assert sorted(names) == sorted(set(names)), sorted({n for n in names if names.count(n) > 1})
