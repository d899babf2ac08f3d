"""runner.app.argv_checks: `run`'s command line checked before Hydra reads it, each problem said with what to do.
The whole way from a bad command line to exit 2: test_bad_input.py."""

from __future__ import annotations

import pytest

from runner.app.argv_checks import input_problems

pytestmark = pytest.mark.unit


def test_an_override_that_does_not_parse_and_a_stray_word_are_named(tmp_path) -> None:
    (found,) = input_problems(["topology.hosts=[{name: a"])
    assert found.startswith("error: topology.hosts: the override 'topology.hosts=[{name: a' does not parse: ")
    (stray,) = input_problems(["train"])
    assert stray.startswith("error: 'train' is neither an override (key=value) nor a script")


def test_flags_and_their_values_are_hydras_and_a_bad_yaml_file_is_named_by_line(tmp_path) -> None:
    assert input_problems(["--cfg", "job", "--info", "defaults", "-m", "topology=1x1,1x2", "+x=1", "~y"]) == []
    (tmp_path / "topology").mkdir()
    (tmp_path / "topology" / "boxes.yaml").write_text("hosts:\n  - {name: a, devices: 2\n")
    (found,) = input_problems(["--config-dir", str(tmp_path)])
    assert found.startswith(f"error: {tmp_path / 'topology' / 'boxes.yaml'}:3:1: not valid YAML: ")
