"""runner.spec.job: a validated job's size, whatever the topology and the parallel mode."""

from __future__ import annotations

import pytest

from conftest import make_spec, validate

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("devices, parallel, world, uniform", [
    ([2, 2], "ddp", 4, True), ([2, 1], "ddp", 3, False), ([4], "ddp", 4, True), ([4], "dp", 1, True),
])
def test_the_world_is_a_process_per_device_or_per_host_for_dp(devices, parallel, world, uniform) -> None:
    got = validate(make_spec(devices=devices, names=[f"h{i}" for i in range(len(devices))], launcher="manual",
                             parallel=parallel, device="cuda"), cuda_devices=4)
    assert got.valid, got.rendered()
    assert (got.job.world_size, got.job.uniform) == (world, uniform)
