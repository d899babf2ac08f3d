"""runner.launchers.elastic.liveness: one meaning of "lost" for every launcher that outlives its hosts."""

from __future__ import annotations

import pytest

from runner.launchers.elastic import decisions, liveness
from runner.launchers.slurm import rounds as slurm_rounds
from runner.launchers.ssh import protocol

pytestmark = pytest.mark.unit


def test_a_host_silent_for_four_of_its_intervals_is_lost_under_every_launcher() -> None:
    assert liveness.BEATS_MISSED == 4 and liveness.silent_after_s(2) == 8
    assert protocol.BEATS_MISSED is slurm_rounds.BEATS_MISSED is decisions.BEATS_MISSED is liveness.BEATS_MISSED
