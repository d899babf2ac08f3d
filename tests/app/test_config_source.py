"""runner.app.config_source: topology=NxM for any shape."""

from __future__ import annotations

import pytest

from conftest import compose
from runner.app.config_source import parse_shape

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("path, shape", [("topology/3x4", (3, 4)), ("topology/12x8.yaml", (12, 8)),
                                         ("/topology/1x1", (1, 1)), ("topology/0x2", None), ("topology/2x", None),
                                         ("launcher/3x4", None), ("topology/1x99999", None)])
def test_shapes(path, shape) -> None:
    assert parse_shape(path) == shape


def test_a_shape_that_is_no_file_composes_and_a_shipped_one_wins() -> None:
    spec = compose("topology=7x3")
    assert (spec.topology.nodes, spec.topology.devices_per_node, spec.topology.hosts) == (7, 3, None)
    assert compose("topology=2x2").topology.nodes == 2
