"""runner.app.topology_shapes: topology=NxM for any shape, from the command line (sweeps too) and from the
defaults lists of a user's job files; a shipped file and a user's own file of that name win."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import compose
from runner.app.topology_shapes import config_folders, parse_shape, shapes_in_defaults, shapes_in_overrides

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name, shape", [("3x4", (3, 4)), ("12x8", (12, 8)), ("1x1", (1, 1)), ("0x2", None),
                                         ("2x", None), ("x2", None), ("1x99999", None), ("custom", None)])
def test_shapes(name, shape) -> None:
    assert parse_shape(name) == shape


def test_the_shapes_overrides_choose() -> None:
    assert shapes_in_overrides(["topology=3x4", "recipe.lr=0.1", "launcher=slurm"]) == {(3, 4)}
    assert shapes_in_overrides(["topology=1x1,1x2,3x4"]) == {(1, 1), (1, 2), (3, 4)}  # a sweep
    assert shapes_in_overrides(["topology=choice(5x1, 2x6)", "+topology=7x7"]) == {(5, 1), (2, 6), (7, 7)}
    # only the topology group's choice: a key that merely mentions a shape, or another group, is not one
    assert shapes_in_overrides(["recipe.name=3x4", "topology.nodes=3", "launcher=3x4", "topology"]) == set()


def test_the_shapes_job_files_choose(tmp_path: Path) -> None:
    (tmp_path / "experiment").mkdir()
    (tmp_path / "big.yaml").write_text("defaults:\n  - job\n  - override /topology: 3x4\n  - _self_\n")
    (tmp_path / "experiment" / "small.yaml").write_text("defaults:\n  - topology: 1x3\n  - recipe: digits\n")
    (tmp_path / "other.yaml").write_text("defaults:\n  - override /launcher: 2x2\nrecipe: {name: 9x9}\n")
    (tmp_path / "broken.yaml").write_text("defaults: [\n")  # Hydra reports it (and run's input check first)
    assert shapes_in_defaults(tmp_path) == {(3, 4), (1, 3)}
    assert config_folders(["--config-dir", str(tmp_path), "topology=2x2"]) == [tmp_path]
    assert config_folders([f"-cd={tmp_path}", "--config-dir", str(tmp_path / "missing")]) == [tmp_path]


def test_a_shape_that_is_no_file_composes_and_a_shipped_one_wins() -> None:
    spec = compose("topology=7x3")
    assert (spec.topology.nodes, spec.topology.devices_per_node, spec.topology.hosts) == (7, 3, None)
    assert compose("topology=2x2").topology.nodes == 2


def test_what_a_composed_shape_holds_is_what_a_shipped_file_holds() -> None:
    """conf/topology/1x2.yaml against the same grid made for a shape that is no file (9x2 with nodes=1)."""
    shipped = compose("topology=1x2").topology
    made = compose("topology=9x2", "topology.nodes=1").topology
    assert made == shipped
