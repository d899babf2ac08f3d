"""`run --help`'s options: every key of every group's schema, with the schema's default and the first line of its
documentation (the field docstrings of runner.spec.schema). Hydra's help template (conf/job.yaml) takes the text
through the ``runner_options`` resolver, which runner.app.cli registers."""

from __future__ import annotations

import textwrap
import typing
from collections.abc import Iterator
from dataclasses import MISSING as NO_DEFAULT
from dataclasses import Field, fields, is_dataclass
from enum import Enum
from typing import Any

from omegaconf import MISSING

from runner.spec.schema import RECIPE_SCHEMAS, JobConfig, RecipeConfig, field_docs

KEY_WIDTH = 44  # the column where the documentation starts
WIDTH = 118  # lines are wrapped to this


def options_help() -> str:
    """The options section of `run --help`: each group's keys (``key=default  summary``), the recipes' own keys,
    then the job's own keys. ``$`` is doubled: Hydra's help template is a ``string.Template``."""
    docs = field_docs(JobConfig)
    hints = typing.get_type_hints(JobConfig)
    lines = [textwrap.fill("Override any key (key=value); the defaults are the schema's, which a group's option may set "
                           "otherwise (`run --cfg job` prints this job's values).", WIDTH)]
    own: list[str] = []
    for f in fields(JobConfig):
        if f.name == "recipe":
            lines += ["", f"recipe: {docs[f.name]}", *_recipe_lines()]
        elif is_dataclass(hints[f.name]) and f.default is MISSING:  # a group: its option fills the schema
            lines += ["", f"{f.name}: {docs[f.name]}", *_lines(hints[f.name](), f"{f.name}.")]
        elif is_dataclass(default := _default(f)):  # a section of the job's own (log)
            own += _lines(default, f"{f.name}.")
        else:
            own += _field_lines(JobConfig, f, default, "")
    lines += ["", "the job's own keys:", *own]
    return "\n".join(lines).replace("$", "$$")


def _recipe_lines() -> Iterator[str]:
    """Every recipe's keys, then what each recipe schema adds to them or sets otherwise."""
    base = RecipeConfig()
    yield from _lines(base, "recipe.")
    for name, schema in RECIPE_SCHEMAS.items():
        if schema is RecipeConfig:
            continue
        recipe = schema()
        changed = [f for f in fields(schema) if not hasattr(base, f.name) or getattr(base, f.name) != getattr(recipe, f.name)]
        yield f"  recipe={name}: {schema.__doc__}"
        for f in changed:
            yield from _field_lines(schema, f, getattr(recipe, f.name), "recipe.", indent="    ")


def _lines(instance: Any, prefix: str) -> Iterator[str]:
    """The keys of a schema instance, nested schemas (launcher.slurm) and lists of them (topology.hosts) spelt out."""
    schema = type(instance)
    for f in fields(schema):
        value = getattr(instance, f.name)
        if is_dataclass(value):
            yield from _lines(value, f"{prefix}{f.name}.")
            continue
        yield from _field_lines(schema, f, value, prefix)
        item = _listed_schema(schema, f)
        if item is not None:
            yield from _lines(item(), f"{prefix}{f.name}[i].")


def _field_lines(schema: type, f: Field, value: Any, prefix: str, indent: str = "  ") -> list[str]:
    """``key=default`` and the first line of the field's documentation (with an enum's choices), wrapped."""
    summary = field_docs(schema)[f.name].splitlines()[0]
    if isinstance(value, Enum):
        summary += f" [{'|'.join(str(m.value) for m in type(value))}]"
    key = f"{indent}{prefix}{f.name}={_shown(value)}"
    if len(key) >= KEY_WIDTH:
        return [key, textwrap.fill(summary, WIDTH, initial_indent=" " * KEY_WIDTH, subsequent_indent=" " * KEY_WIDTH)]
    return [textwrap.fill(summary, WIDTH, initial_indent=key.ljust(KEY_WIDTH), subsequent_indent=" " * KEY_WIDTH)]


def _listed_schema(schema: type, f: Field) -> type | None:
    """The schema of a field that lists schemas (``list[HostConfig]``, optional or not); None for any other."""
    hint = typing.get_type_hints(schema)[f.name]
    for arg in (hint, *typing.get_args(hint)):
        if typing.get_origin(arg) is list and typing.get_args(arg) and is_dataclass(typing.get_args(arg)[0]):
            return typing.get_args(arg)[0]
    return None


def _default(f: Field) -> Any:
    return f.default_factory() if f.default is NO_DEFAULT and f.default_factory is not NO_DEFAULT else f.default


def _shown(value: Any) -> str:
    """A default as it is written in YAML and on the command line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, list):
        return "[" + ",".join(_shown(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_shown(v)}" for k, v in value.items()) + "}"
    return str(value)
