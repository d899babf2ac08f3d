"""The shape of runner/: its layers point one way (the contracts in pyproject.toml, checked by import-linter),
a contract that is broken fails, the bundled recipes use only the public API, every environment class reads
only the variables it declares, and the private APIs of other packages that the runner relies on are still
there (each would otherwise fail deep inside a run after an upgrade)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.unit

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_layers_point_one_way() -> None:
    done = lint_imports(REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 2 kept, 0 broken." in done.stdout


def test_an_import_from_a_lower_layer_to_a_higher_one_breaks_the_contract(tmp_path) -> None:
    """The check is real: a copy of runner/ in which the plan imports a launcher fails it, naming the import."""
    shutil.copytree(REPO / "runner", tmp_path / "runner", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    render = tmp_path / "runner" / "plan" / "render.py"
    render.write_text(render.read_text() + "\nfrom runner.launchers.base import Launcher  # a deliberate violation\n")
    done = lint_imports(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "runner.plan is not allowed to import runner.launchers" in done.stdout
    assert "runner.plan.render -> runner.launchers.base" in done.stdout


def _imports(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names)


def test_the_bundled_recipes_use_the_public_api_only() -> None:
    """recipes/ ships as runner.recipes, outside runner/'s folder (so import-linter does not see it)."""
    used = {m for path in (REPO / "recipes").glob("*.py") for m in _imports(path) if m.startswith("runner")}
    assert used and used <= {"runner.api"}, used


class _Recording(Mapping[str, str]):
    """An environment that remembers which variables were asked for."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values, self.asked = values, set()

    def __getitem__(self, key: str) -> str:
        self.asked.add(key)
        return self.values[key]

    def get(self, key, default=None):
        self.asked.add(key)
        return self.values.get(key, default)

    def __contains__(self, key: object) -> bool:
        self.asked.add(key)
        return key in self.values

    def __iter__(self):
        raise AssertionError("an environment class lists the whole environment instead of reading its variables")

    def __len__(self) -> int:
        return len(self.values)


def test_each_environment_class_reads_the_variables_it_declares_and_no_others() -> None:
    from runner.environments import mpi, process, slurm

    for module, read in ((slurm, slurm.SlurmEnvironment.read), (mpi, mpi.MpiEnvironment.read)):
        env = _Recording({})
        read(env)
        declared = set(module.VARIABLES) if isinstance(module.VARIABLES, dict) and module is slurm else \
            {v for names in module.VARIABLES.values() for v in names}
        assert env.asked and env.asked <= declared, (module.__name__, env.asked - declared)
    env = _Recording({})
    process.ProcessEnvironment.read(env)
    declared = set(process.VARIABLES) | set(slurm.VARIABLES) | {v for names in mpi.VARIABLES.values() for v in names}
    assert env.asked <= declared, env.asked - declared


# ------------------------------------------------------------------------------ other packages' private APIs


def test_hydra_internals_the_config_source_relies_on() -> None:
    """runner.app.config_source subclasses Hydra's pkg:// source, and runner.app.cli registers it in Hydra's
    sources registry (hydra-core is pinned below 1.4 for that): both must still be where they were."""
    from hydra._internal.core_plugins.importlib_resources_config_source import ImportlibResourcesConfigSource
    from hydra._internal.sources_registry import SourcesRegistry

    import runner.app.cli
    from runner.app.config_source import RunnerConfigSource

    for method in ("load_config", "is_config", "list"):
        assert callable(getattr(ImportlibResourcesConfigSource, method))
    runner.app.cli.setup()
    assert SourcesRegistry.instance().types["pkg"] is RunnerConfigSource


def test_optimizer_internals_the_sharding_strategies_empty() -> None:
    """runner.training.sharding drops the gathered shards that fairscale's OSS (``_all_states``) and torch's
    ZeroRedundancyOptimizer (``_all_state_dicts``) keep after consolidating, or rank 0 would hold every
    rank's optimizer state for the rest of the run: the attributes must still exist."""
    import inspect

    from fairscale.optim import OSS
    from torch.distributed.optim import ZeroRedundancyOptimizer

    assert "_all_states" in inspect.getsource(OSS.consolidate_state_dict)
    assert "_all_state_dicts" in inspect.getsource(ZeroRedundancyOptimizer.consolidate_state_dict)


def test_torch_reads_the_default_timeouts_the_runner_sets_for_scripts() -> None:
    """A torchrun-style script's process group made without a timeout gets init.timeout_s because torch
    reads these public module attributes when ``timeout`` is None (runner.worker.rank)."""
    import datetime

    import torch.distributed.distributed_c10d as c10d

    saved = c10d.default_pg_timeout
    try:
        c10d.default_pg_timeout = datetime.timedelta(seconds=7)
        assert c10d._get_default_timeout(c10d.Backend.GLOO) == datetime.timedelta(seconds=7)
    finally:
        c10d.default_pg_timeout = saved
