"""runner.spec.schema: every option of every schema is documented where it is declared (the string after the
field), and that documentation is what `run --help` shows (runner.app.help)."""

from __future__ import annotations

import inspect
from dataclasses import fields, is_dataclass

import pytest

import runner.spec.schema as schema
from runner.app.help import options_help
from runner.spec.schema import LauncherConfig, ScriptRecipeConfig, field_docs

pytestmark = pytest.mark.unit

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


def test_the_options_show_every_groups_keys_with_default_and_doc() -> None:
    text = options_help()
    words = " ".join(text.split())  # as wrapped
    assert f"launcher.grace_s=10.0 {field_docs(LauncherConfig)['grace_s'].splitlines()[0]}" in words
    for key in ("topology.hosts[i].gpus=null", "init.method=env", "launcher.slurm.time=01:00:00", "backend.env={}",
                "sharding.reduce_buffer_size=0", "recipe.target=???", "recipe.epochs=20", "recipe.path=null",
                "log.console=main", "dry_run=false"):
        assert f" {key} " in text or f" {key}\n" in text, key
    assert "[env|tcp|file]" in text  # an enum's choices
    assert "$" not in text.replace("$$", "")  # Hydra's help template is a string.Template
