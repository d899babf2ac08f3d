"""The spec as a document: the YAML of a run's ``spec.yaml``, which the dry run prints and a scheduler's tasks load
back equal to the spec `run` wrote, and the recipe's config as the recipe function receives it. Both are made from
the one typed spec (runner.spec.pins says why there is one)."""

from __future__ import annotations

from dataclasses import is_dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from runner.spec.schema import JobConfig, recipe_schema


def spec_yaml(spec: JobConfig) -> str:
    """The spec as YAML: every key, resolved (what Hydra composed, with what the launch pinned)."""
    return OmegaConf.to_yaml(OmegaConf.structured(spec))


def load_spec(path: Path) -> JobConfig:
    """The spec a run's spec.yaml holds, typed again: equal to the spec it was written from (:func:`spec_yaml`).
    YAML keeps no types, so a recipe's config is typed again by the schema of the recipe it names (digits,
    script: runner.spec.schema.recipe_schema); a recipe of no schema's (recipe=custom) stays a dict, as it was."""
    return _typed(OmegaConf.load(path))


class SpecTextError(ValueError):
    """A spec's text that is no spec: not YAML, a key no schema has, a value of the wrong type."""


def load_spec_text(text: str) -> JobConfig:
    """:func:`load_spec` of a spec.yaml's text (launcher=ssh sends it to each host over ssh); a text that is no spec
    raises :class:`SpecTextError`, saying why."""
    try:
        return _typed(OmegaConf.create(text))
    except (yaml.YAMLError, OmegaConfBaseException) as e:
        raise SpecTextError(str(e).strip()) from None


def _typed(written: DictConfig) -> JobConfig:
    typed = OmegaConf.structured(JobConfig)
    recipe = written.get("recipe")
    schema = recipe_schema(recipe) if isinstance(recipe, DictConfig) else None
    if schema is not None:
        typed.recipe = OmegaConf.structured(schema)
    return OmegaConf.to_object(OmegaConf.merge(typed, written))


def recipe_config(recipe: Any) -> DictConfig:
    """What the recipe function receives as its config: the spec's recipe as a plain DictConfig, untyped and open
    (a recipe may add keys), the same under every launcher."""
    return OmegaConf.create(OmegaConf.to_container(OmegaConf.structured(recipe)) if is_dataclass(recipe) else recipe)
