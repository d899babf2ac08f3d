"""runner.worker.host_ending: how a host's ranks ended — which failed, which by themselves (not stopped by the agent),
the first of them in the order they ended, and a rank the end guard ended after its work was done, which is no
failure."""

from __future__ import annotations

import pytest

from runner.worker.host_ending import HostEnding
from runner.worker.rank_life import Stuck

pytestmark = pytest.mark.unit


def test_the_first_failure_is_the_first_rank_to_fail_by_itself() -> None:
    ending = HostEnding(codes={0: -15, 1: 1, 2: 0, 3: 1}, order=[0, 3, 1, 2], stopped={0})
    assert ending.failed and ending.failed_by_itself() and ending.first_failure() == 3
    stopped = HostEnding(codes={0: -15, 1: 0}, order=[0, 1], stopped={0})
    assert stopped.failed and not stopped.failed_by_itself() and stopped.first_failure() is None
    assert not HostEnding(codes={0: 0, 1: 0}, order=[1, 0]).failed


def test_a_rank_ended_by_the_end_guard_after_its_work_is_no_failure() -> None:
    done = Stuck(index=1, text="rank 1 destroyed its process group at 2.1 s and did not end; ended it", work_done=True)
    ending = HostEnding(codes={0: 0, 1: -9}, order=[0, 1], stopped={1}, stuck={1: done})
    assert not ending.failed and ending.first_failure() is None
    working = HostEnding(codes={0: 0, 1: -9}, order=[0, 1], stuck={1: Stuck(index=1, text="stalled",
                                                                            work_done=False)})
    assert ending.codes[1] and working.failed and working.first_failure() == 1
