"""runner.worker.watch, the parts without processes: reading torch's flight recorder, the runner's own counter
where there is none, and where the main thread is."""

from __future__ import annotations

import threading
import time

import pytest

from runner.worker.watch import _Counter, _groups_from_fr, main_thread_at

pytestmark = pytest.mark.unit


def test_the_flight_recorders_record_as_groups() -> None:
    doc = {"pg_status": {"0": {"last_enqueued_collective": "5", "last_completed_collective": "4"}},
           "entries": [{"pg_id": 0, "collective_seq_id": 4, "profiling_name": "gloo:broadcast", "input_sizes": [[10]],
                        "input_dtypes": ["Float"], "time_created_ns": 2_000_000_000},
                       {"pg_id": 0, "collective_seq_id": 0, "p2p_seq_id": 1, "profiling_name": "gloo:send"},
                       {"pg_id": 0, "collective_seq_id": 5, "profiling_name": "gloo:all_reduce", "input_sizes": [[2, 3]],
                        "input_dtypes": ["Float"], "time_created_ns": 3_500_000_000}]}
    (group,) = _groups_from_fr(doc)
    assert (group.group, group.enqueued, group.completed) == ("0", 5, 4)
    assert [(e.seq, e.op, e.sizes, e.entered_s) for e in group.entries] == [(4, "broadcast", ((10,),), 2.0),
                                                                           (5, "all_reduce", ((2, 3),), 3.5)]
    assert group.entry(5).shape() == "Float[2, 3]"


def test_the_runners_own_counter() -> None:
    import torch

    calls = []
    counter = _Counter()
    counted = counter._wrap("all_reduce", lambda t, group=None: calls.append(t.shape))
    counted(torch.ones(3))
    counted(torch.ones(2, 2))
    (group,) = counter.groups()
    assert (group.group, group.enqueued, group.completed) == ("0", 2, 2)
    assert [(e.seq, e.op, e.sizes, e.dtypes) for e in group.entries] == [(1, "all_reduce", ((3,),), ("float32",)),
                                                                        (2, "all_reduce", ((2, 2),), ("float32",))]
    assert calls == [torch.Size([3]), torch.Size([2, 2])]


def test_where_the_main_thread_is_from_another_thread(tmp_path) -> None:
    seen = []
    thread = threading.Thread(target=lambda: (time.sleep(0.2), seen.append(main_thread_at(None))))
    thread.start()
    thread.join()  # the main thread waits here, in this test's own function
    assert len(seen) == 1 and seen[0].startswith("test_watch.py:") and seen[0].endswith(
        " in test_where_the_main_thread_is_from_another_thread")
