"""runner.spec.document: the spec written as spec.yaml and loaded back by a scheduler's tasks is the same spec, and
the recipe's config is what the recipe function gets under every launcher."""

from __future__ import annotations

import pytest
from omegaconf import DictConfig, OmegaConf

from conftest import TARGET, compose
from runner.spec.document import load_spec, recipe_config, spec_yaml
from runner.spec.schema import ScriptRecipeConfig

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("overrides", [
    (f"recipe.target={TARGET}", "topology=2x2", "launcher=slurm", "init=file", "init.master_port=29400"),
    ("recipe=script", "recipe.path=train.py", "recipe.args=['--lr=0.1', 'a b']", "topology=1x2"),
    ("recipe=custom", f"recipe.target={TARGET}", "+recipe.lr=0.1", "+recipe.layers=[64, 32]",
     "topology.hosts=[{name: a, addr: 10.0.0.1, devices: 2, gpus: [3, 1]}]", "topology=custom"),
], ids=["digits", "script", "custom"])
def test_spec_yaml_loads_back_as_the_spec_it_was_written_from(tmp_path, overrides) -> None:
    spec = compose(*overrides)
    (tmp_path / "spec.yaml").write_text(spec_yaml(spec))
    loaded = load_spec(tmp_path / "spec.yaml")
    assert loaded == spec and type(loaded.recipe) is type(spec.recipe)


def test_a_script_recipe_is_typed_again_by_its_schema(tmp_path) -> None:
    spec = compose("recipe=script", "recipe.path=train.py", "recipe.args=['--epochs', '3']")
    (tmp_path / "spec.yaml").write_text(spec_yaml(spec))
    loaded = load_spec(tmp_path / "spec.yaml")
    assert isinstance(loaded.recipe, ScriptRecipeConfig) and loaded.recipe.args == ["--epochs", "3"]


def test_the_recipe_gets_its_config_plain_and_open() -> None:
    typed = recipe_config(compose(f"recipe.target={TARGET}", "recipe.epochs=3").recipe)
    custom = recipe_config(compose("recipe=custom", f"recipe.target={TARGET}", "+recipe.lr=0.1").recipe)
    for cfg in (typed, custom):
        assert isinstance(cfg, DictConfig) and OmegaConf.get_type(cfg) is dict  # no schema behind it
        cfg.added = 1  # a recipe may add keys
    assert typed.epochs == 3 and custom.lr == 0.1 and custom.target == TARGET
