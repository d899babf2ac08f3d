"""runner.spec.schema: the functions beside the dataclasses (a recipe config read back untyped finds its schema,
what the runner reads of any recipe, keys beyond a schema), and every option of every schema documented where it is
declared (the string after the field; tests/app/test_help.py: what `run --help` shows of it)."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import fields, is_dataclass

import pytest
from omegaconf import OmegaConf

import runner.spec.schema as schema
from conftest import TARGET, hydra_compose
from runner.spec.schema import (
    DigitsRecipeConfig,
    RecipeConfig,
    ScriptRecipeConfig,
    field_docs,
    is_script,
    recipe_schema,
    recipe_settings,
    unknown_keys,
)

pytestmark = pytest.mark.unit


def test_a_recipe_read_back_finds_the_schema_whose_keys_it_has_exactly() -> None:
    digits = dataclasses.asdict(DigitsRecipeConfig())
    script = dataclasses.asdict(ScriptRecipeConfig(path="train.py"))
    assert (recipe_schema(digits), recipe_schema(script)) == (DigitsRecipeConfig, ScriptRecipeConfig)
    assert recipe_schema({**digits, "my_option": 0.1}) is None  # one key more: recipe=custom, untyped
    assert recipe_schema({"target": TARGET, "global_batch_size": 4}) is None  # the base alone is no recipe's own


def test_what_the_runner_reads_of_any_recipe() -> None:
    typed = DigitsRecipeConfig(global_batch_size=32)
    assert recipe_settings(typed) is typed
    custom = recipe_settings({"target": "pkg.train:main", "global_batch_size": 12, "lr": 0.1,
                              "init_process_group": False})
    assert custom == RecipeConfig(target="pkg.train:main", global_batch_size=12, seed=RecipeConfig().seed,
                                  init_process_group=False)
    assert recipe_settings("odd").target == "'odd'"


def test_a_script_recipe_typed_or_not() -> None:
    script = ScriptRecipeConfig(path="train.py")
    assert is_script(script) and is_script(dataclasses.asdict(script))
    assert not is_script(DigitsRecipeConfig()) and not is_script({"target": TARGET})


def test_keys_beyond_the_schema_are_found_with_the_schemas_keys() -> None:
    cfg = hydra_compose("+topology.nodez=2", "+init.extra=1", "recipe=custom", f"recipe.target={TARGET}", "+recipe.lr=1")
    found = dict(unknown_keys(cfg))
    assert sorted(found) == ["init.extra", "topology.nodez"]  # recipe=custom takes any key
    assert "nodes" in found["topology.nodez"] and "devices_per_node" in found["topology.nodez"]
    assert unknown_keys(hydra_compose()) == [] and unknown_keys(OmegaConf.create([1])) == []


SCHEMAS = [cls for _, cls in inspect.getmembers(schema, inspect.isclass)
           if is_dataclass(cls) and cls.__module__ == schema.__name__]


@pytest.mark.parametrize("cls", SCHEMAS, ids=lambda c: c.__name__)
def test_every_field_of_every_schema_has_a_doc_whose_first_line_sums_it_up(cls) -> None:
    docs = field_docs(cls)
    for f in fields(cls):
        assert docs.get(f.name, "").strip(), f"{cls.__name__}.{f.name} has no docstring"
        summary = docs[f.name].splitlines()[0]
        assert summary.endswith((".", ")")) and len(summary) <= 112, (cls.__name__, f.name, summary)


def test_a_field_inherited_or_overridden_has_its_own_classs_doc() -> None:
    docs = field_docs(ScriptRecipeConfig)
    assert docs["seed"].startswith("The random seed")  # inherited from RecipeConfig
    assert docs["init_process_group"].startswith("false: the script calls")  # overridden, with its own doc
