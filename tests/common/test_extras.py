"""runner.common.extras: fairscale, scikit-learn and matplotlib are pip extras, as pyproject.toml declares them, and
a missing one is named, with the command that installs it, before any process starts. Absence is simulated by
making the import fail (``sys.modules[name] = None``), in this process or, through a ``sitecustomize`` module, in
`run`'s."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest

from readme_text import docs
from runs import run, user_env
from conftest import REPO
from runner.common import extras

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[;\s]", requirement, maxsplit=1)[0].lower()


@pytest.mark.unit
def test_the_extras_are_those_pyproject_declares() -> None:
    optional = PYPROJECT["optional-dependencies"]
    for extra in extras.EXTRAS:
        assert [_name(r) for r in optional[extra.name]] == [extra.package], extra
    assert optional["all"] == [f"torch-jobspec[{','.join(e.name for e in extras.EXTRAS)}]"]
    assert "torch-jobspec[all]" in optional["test"]
    required = {_name(r) for r in PYPROJECT["dependencies"]}
    assert required == {"torch", "hydra-core", "omegaconf", "pyyaml", "psutil", "tqdm"}  # docs/index.md: what `run` itself needs


@pytest.mark.unit
def test_the_readme_lists_the_extras() -> None:
    """docs/index.md, Setup: the table of the extras."""
    text = docs().section("Setup")
    table = text[text.index("| extra | installs | for |"):].split("\n\n", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| ([\w-]+) \|", table, re.M)
    assert rows == [(e.name, e.package) for e in extras.EXTRAS], rows
    assert "| `all` | all three |" in table


@pytest.mark.unit
def test_the_setup_script_installs_every_extra() -> None:
    """The README's first command (`bash scripts/setup.sh && .venv/bin/run`) trains digits: it needs `examples`."""
    assert 'pip install --no-compile -e ".[all,test]"' in (REPO / "scripts" / "setup.sh").read_text()


@pytest.mark.unit
def test_a_missing_extra_is_said_in_one_line_with_its_install_command(monkeypatch) -> None:
    assert extras.PLOTS.installed()
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert not extras.PLOTS.installed()
    with pytest.raises(extras.MissingExtra) as caught:
        extras.require(extras.PLOTS)
    assert str(caught.value) == ("a sweep's scaling plot needs matplotlib, which is not installed here (the extra "
                                 "torch-jobspec[plots]); hint: pip install 'torch-jobspec[plots]'")


def _without(tmp_path: Path, *modules: str) -> dict[str, str]:
    """An environment in which `run` (and everything it forks) cannot import ``modules``."""
    site = tmp_path / "hide"
    site.mkdir()
    (site / "sitecustomize.py").write_text(f"import sys\nfor m in {modules!r}:\n    sys.modules[m] = None\n")
    return user_env({"PYTHONPATH": str(site)})


def test_a_fairscale_mode_without_fairscale_is_refused_before_anything_starts(tmp_path) -> None:
    done = run("sharding=oss", "topology=1x2", "device=cpu", cwd=tmp_path, env=_without(tmp_path, "fairscale"),
               workloads=False, timeout=120)
    assert done.code == 2, done.output
    assert ("error: sharding.mode: oss: sharding=oss and sharding=sdp (fairscale's OSS and ShardedDDP) needs fairscale, "
            "which is not installed here (the extra torch-jobspec[fairscale])\n"
            "    hint: pip install 'torch-jobspec[fairscale]'; or torch's own: sharding=zero") in done.stderr
    assert "nothing was started" in done.stderr and not list(tmp_path.rglob("rank*.log"))


def test_the_digits_recipe_without_scikit_learn_is_refused_before_anything_starts(tmp_path) -> None:
    """The default job, as the README's first command runs it, in an install without the extra ``examples``."""
    done = run("device=cpu", cwd=tmp_path, env=_without(tmp_path, "sklearn"), workloads=False, timeout=120)
    assert done.code == 2, done.output
    assert ("error: recipe.target: runner.recipes.digits:main: the bundled digits recipe (scikit-learn's digits data) "
            "needs scikit-learn, which is not installed here (the extra torch-jobspec[examples])\n"
            "    hint: pip install 'torch-jobspec[examples]'") in done.stderr
    assert "nothing was started" in done.stderr and not list(tmp_path.rglob("rank*.log"))
