"""runner.app.help: `run --help`'s options, each group's keys with the schema's default and the first line of the
field's docstring (tests/app/test_cli.py: the real `run --help`)."""

from __future__ import annotations

import pytest

from runner.app.help import options_help
from runner.spec.schema import LauncherConfig, field_docs

pytestmark = pytest.mark.unit


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
