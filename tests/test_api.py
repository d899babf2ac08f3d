"""runner.api, the API recipes are written against, is frozen: its names and the signatures of what a recipe calls
are those of tests/golden/api/runner_api.txt (a change to them is a change to that file, seen in review:
``UPDATE_GOLDEN=1`` rewrites it), and docs/recipes.md's table of the run context names every public member, and no
other. docs/recipes.md's example of a recipe called in one process runs, as a user's pytest would run it."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys

import pytest

from readme_text import docs
from runs import user_env
from conftest import GOLDEN

SNAPSHOT = GOLDEN / "api" / "runner_api.txt"  # beside the launchers' golden/*.txt, not among them


def _members(cls: type) -> list[str]:
    lines = []
    for name, value in sorted(vars(cls).items()):
        if name.startswith("_") and name != "__call__":
            continue
        if isinstance(value, property):
            returns = inspect.signature(value.fget).return_annotation
            lines.append(f"{cls.__name__}.{name}: property -> {returns}")
        elif isinstance(value, staticmethod | classmethod):
            kind = type(value).__name__
            lines.append(f"{cls.__name__}.{name}{inspect.signature(value.__func__)}  [{kind}]")
        elif callable(value):
            lines.append(f"{cls.__name__}.{name}{inspect.signature(value)}")
        else:
            lines.append(f"{cls.__name__}.{name} = {value!r}")
    return lines


def surface() -> str:
    """What runner.api offers, one line per name, member and signature."""
    import runner.api as api

    lines = [f"runner.api.__all__ = {sorted(api.__all__)}"]
    assert sorted(n for n in vars(api) if not n.startswith("_") and n not in api.__all__ and
                  getattr(vars(api)[n], "__module__", "").startswith("runner")) == [], "a public name not in __all__"
    lines.append(f"single_process_context{inspect.signature(api.single_process_context)}")
    lines += _members(api.Recipe)
    lines += _members(api.RunContext)
    return "\n".join(lines) + "\n"


def test_the_api_is_what_the_snapshot_says() -> None:  # (runner.api imports torch: not a unit test)
    text = surface()
    if os.environ.get("UPDATE_GOLDEN") == "1":
        SNAPSHOT.write_text(text)
    assert SNAPSHOT.exists(), f"{SNAPSHOT} is missing: run with UPDATE_GOLDEN=1 and review it"
    assert text == SNAPSHOT.read_text(), (f"runner.api changed: a change to the recipe API is a change to {SNAPSHOT} "
                                          f"(UPDATE_GOLDEN=1 rewrites it; review the diff)")


def _readme_table_names() -> set[str]:
    text = docs().page_with("Recipes").text
    start = text.index("metrics (over `metrics.jsonl`'s last row). The context gives:")
    table = text[start:text.index("\n\n", text.index("| |", start))]
    return {name for row in table.splitlines()[3:] for name in re.findall(r"ctx\.(\w+)", row.split(" | ")[0])}


@pytest.mark.docs
def test_the_readmes_table_names_every_member_of_the_context_and_no_other() -> None:
    from runner.api import RunContext

    public = {n for n in vars(RunContext) if not n.startswith("_")}
    assert _readme_table_names() == public


def _readme_example() -> str:
    return docs().section("A recipe in one process").split("```python\n", 1)[1].split("```", 1)[0]


def test_the_readmes_one_process_example_runs_as_a_users_test(tmp_path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_digits.py").write_text(_readme_example())
    done = subprocess.run([sys.executable, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_digits.py"],
                          cwd=tmp_path, env=user_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
