"""The wheel ships the config groups inside the package (runner/conf) and works without the checkout.

The project is copied (only what the build needs) to a temporary folder and built there, so the
build writes nothing into the repository; nothing is downloaded (--no-index, --no-build-isolation:
setuptools comes from the venv).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

from conftest import REPO
from runs import started, user_env

BUILD_INPUTS = ("pyproject.toml", "README.md", "runner", "conf", "recipes", "hydra_plugins")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in BUILD_INPUTS:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif path.exists():
            shutil.copy2(path, src / name)
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", str(out), str(src)],
        env=user_env({"PIP_DISABLE_PIP_VERSION_CHECK": "1"}), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = out.glob("torch_jobspec-*.whl")
    return whl


@pytest.fixture(scope="module")
def site(wheel: Path, tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("site")
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(target), str(wheel)],
        env=user_env({"PIP_DISABLE_PIP_VERSION_CHECK": "1"}), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return target


def test_wheel_contains_every_config_and_the_recipes(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "runner/conf/job.yaml" in names
    shipped = sorted(p.relative_to(REPO / "conf").as_posix() for p in (REPO / "conf").glob("*/*.yaml"))
    assert shipped, "conf/ has no group options?"
    missing = [f"runner/conf/{p}" for p in shipped if f"runner/conf/{p}" not in names]
    assert not missing, missing
    assert "runner/recipes/__init__.py" in names  # the bundled recipes, inside the runner's own package ...
    assert not [n for n in names if n.startswith("recipes/")]  # ... so a user's `recipes` package is theirs
    recipes = sorted(p.name for p in (REPO / "recipes").glob("*.py"))
    assert [n for n in recipes if f"runner/recipes/{n}" not in names] == []
    for module in sorted(p.relative_to(REPO).as_posix() for p in (REPO / "runner").rglob("*.py")):
        assert module in names, f"{module} is not in the wheel (is its package listed in pyproject.toml?)"
    assert "hydra_plugins/runner_sweep_launcher/__init__.py" in names  # the sweep launcher (Hydra looks there)
    assert "hydra_plugins/__init__.py" not in names  # a namespace package, shared with other plugins
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "run = runner.app.start:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
    assert entry_points.startswith("torch_jobspec-")  # the distribution's name (`runner` is taken on the index)


PROBE = textwrap.dedent("""
    import json, os, sys
    import runner.recipes
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf
    import runner.app.cli
    from runner.spec.probe import FixedProbe
    from runner.launchers import plan_for, validate

    runner.app.cli.register()
    with initialize_config_module(config_module="runner.conf", version_base=None):
        cfg = compose(config_name="job", overrides=["topology=2x2", "launcher=slurm", "recipe.target=runner.recipes.digits"])
    spec = OmegaConf.to_object(cfg)
    job, problems = validate(spec, FixedProbe())
    print(json.dumps({
        "runner": runner.app.cli.__file__, "conf": runner.conf.__file__, "recipes": runner.recipes.__file__,
        "from_checkout": sorted(n for n, m in sys.modules.items()
                                if (getattr(m, "__file__", None) or "").startswith(tuple(sys.argv[1:]))),
        "nodes": spec.topology.nodes, "devices_per_node": spec.topology.devices_per_node,
        "world_size": plan_for(job).world_size if job else None,
    }))
""")


def _env_for(site: Path) -> dict[str, str]:
    """The installed wheel ahead of the venv's site-packages.

    Used with ``python -S``: the venv's .pth files are not run, so the editable install's finder
    (which maps `runner` to the checkout) is not there; the checkout is not importable at all.
    """
    env = user_env()
    env["PYTHONPATH"] = os.pathsep.join([str(site), sysconfig.get_paths()["purelib"]])
    env.pop("PYTHONSAFEPATH", None)
    return env


def test_installed_wheel_composes_without_the_checkout(site: Path, tmp_path: Path) -> None:
    checkout = [f"{REPO / d}{os.sep}" for d in ("runner", "conf", "recipes", "hydra_plugins")]
    r = subprocess.run([sys.executable, "-S", "-c", PROBE, *checkout], cwd=tmp_path, env=_env_for(site), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    for key in ("runner", "conf", "recipes"):
        assert got[key].startswith(str(site)), got  # the installed copy, not the checkout
    assert got["from_checkout"] == [], got
    assert (got["nodes"], got["devices_per_node"], got["world_size"]) == (2, 2, 4)


def test_installed_wheel_dry_run(site: Path, tmp_path: Path) -> None:
    """`run` itself (its entry point) from the installed wheel: a full dry run, in a folder of its own."""
    code = "import sys; from runner.app.cli import main; sys.argv = ['run', *sys.argv[1:]]; main()"
    with started([sys.executable, "-S", "-c", code, "dry_run=true", "topology=2x2", "launcher=slurm", "device=cpu",
                  "recipe.target=runner.recipes.digits"], cwd=tmp_path, env=_env_for(site)) as proc:
        r = proc.wait(60)
    assert r.code == 0, r.output
    assert "valid: 4 process(es) on 2 host(s)" in r.stdout
    assert any((f / "job.sbatch").is_file() for f in (tmp_path / "outputs").rglob("*") if f.is_dir())
