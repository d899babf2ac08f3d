"""runner.worker.watch, the parts without processes: reading torch's flight recorder, the runner's own counter
where there is none, and where the main thread is."""

from __future__ import annotations

import inspect
import sys
import threading
import traceback

import pytest

from runner.worker.watch import _Counter, _fr_dump, _groups_from_fr, group_key, main_thread_at
from runs import wait_until


@pytest.mark.unit
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


def test_nccls_recorder_and_the_others_are_read_as_one(monkeypatch) -> None:
    """A CUDA build keeps NCCL's groups in a flight recorder of their own (_dump_nccl_trace_json; seen on an H200 with
    torch 2.11: the other recorder's pg_status empty under NCCL): the watch reads both, and a job's gloo group and NCCL
    group are both in its record; without the entries, neither recorder is asked for them."""
    import json

    import torch

    c10d = torch._C._distributed_c10d
    asked = []

    def recorder(groups: dict, entries: list):
        def dump(include_collectives: bool, only_active: bool) -> str:
            asked.append((include_collectives, only_active))
            doc = {"version": "2.10", "pg_status": groups}
            return json.dumps({**doc, "entries": entries} if include_collectives else doc)
        return dump

    monkeypatch.setattr(c10d, "_dump_fr_trace_json", recorder(
        {"1": {"last_enqueued_collective": "2", "last_completed_collective": "2"}},
        [{"pg_id": 1, "collective_seq_id": 2, "profiling_name": "gloo:broadcast", "input_sizes": [[4]]}]))
    monkeypatch.setattr(c10d, "_dump_nccl_trace_json", recorder(
        {"0": {"last_enqueued_collective": "7", "last_completed_collective": "6"}},
        [{"pg_id": 0, "collective_seq_id": 7, "profiling_name": "nccl:all_reduce", "input_sizes": [[8]]}]), raising=False)
    groups = {g.group: (g.enqueued, g.completed, [(e.seq, e.op) for e in g.entries]) for g in _groups_from_fr(_fr_dump())}
    assert groups == {"0": (7, 6, [(7, "all_reduce")]), "1": (2, 2, [(2, "broadcast")])}
    asked.clear()
    status = _fr_dump(entries=False)
    assert asked == [(False, False), (False, False)] and "entries" not in status
    assert sorted(status["pg_status"]) == ["0", "1"]


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


@pytest.fixture
def gloo_world():
    """A real gloo process group of this one process (an in-memory store: no port, no file), destroyed after."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def test_the_counter_names_a_process_group_as_every_rank_does(gloo_world) -> None:
    """A group is keyed by torch's name for it (in a rank's own process "0" for the default group, "1" for the first
    group the ranks made, the same on every rank, as the flight recorder keys it; here, after other tests' groups,
    the next names), not by anything of this process (an object's id differs on each rank), and however the group
    is passed."""
    import torch
    from torch.distributed.distributed_c10d import _get_process_group_name

    dist = gloo_world
    counter = _Counter()
    all_reduce = counter._wrap("all_reduce", dist.all_reduce)
    sub = dist.new_group([0])
    world, mine = _get_process_group_name(dist.group.WORLD), _get_process_group_name(sub)
    assert int(mine) == int(world) + 1  # torch's count of the groups made in this process: not an object's id
    all_reduce(torch.ones(1))
    all_reduce(torch.ones(2), group=sub)
    all_reduce(torch.ones(3), dist.ReduceOp.SUM, sub)  # dist.all_reduce(t, op, group): positionally
    all_reduce(torch.ones(4), group=dist.group.WORLD)
    groups = {g.group: g for g in counter.groups()}
    assert sorted(groups) == [world, mine] and (group_key(None), group_key(sub)) == (world, mine)
    assert [(e.seq, e.sizes) for e in groups[mine].entries] == [(1, ((2,),)), (2, ((3,),))]
    assert [(e.seq, e.sizes) for e in groups[world].entries] == [(1, ((1,),)), (2, ((4,),))]
    assert (groups[mine].completed, groups[world].completed) == (2, 2)


@pytest.mark.unit
def test_where_the_main_thread_is_from_another_thread(tmp_path) -> None:
    seen = []
    main = threading.main_thread().ident

    def look() -> None:  # once the main thread waits in join() below: where it is then
        wait_until(lambda: any(f.name == "join" for f in traceback.extract_stack(sys._current_frames()[main])), 10,
                   "the main thread in join()")
        seen.append(main_thread_at(None))

    thread = threading.Thread(target=look)
    thread.start()
    thread.join()  # the main thread waits here, in this test's own function
    line = inspect.currentframe().f_lineno - 1
    assert seen == [f"test_watch.py:{line} in test_where_the_main_thread_is_from_another_thread"]


def test_the_stall_clock_starts_when_the_process_group_has_formed(tmp_path, monkeypatch) -> None:
    """Rank 0's stall watchdog does not count the time the group takes to form (a host slow to start is no stall):
    long after the watch began, nothing happens until rank 0 has joined; then the clock starts at that moment."""
    from conftest import validate
    from runner.environments.process import ProcessEnvironment
    from runner.launchers import plan_for
    from runner.records.paths import RunPaths
    from runner.worker import watch as watches
    from runner.worker.preparation import rank_setups
    from runner.worker.rendezvous import Rendezvous

    got = validate(("topology=1x2", "device=cpu", "launcher.stall_timeout_s=5"))
    paths = RunPaths(tmp_path, "r1")
    paths.make()
    setup = rank_setups(plan_for(got.job, paths), 0, Rendezvous("env://", "29500", True), paths,
                        ProcessEnvironment.read({}))[0]
    ended: list[str] = []
    monkeypatch.setattr(watches, "ask_for_dumps", lambda *a: 0.0)
    monkeypatch.setattr(watches, "gather_dumps", lambda *a: {})
    monkeypatch.setattr(watches, "_end_rank", lambda _setup, text: ended.append(text))
    watch = watches.Watch(setup)
    began = watch._began
    watch._watch_for_a_stall(5, began + 60)  # a minute on, the group not formed: forming it is init.timeout_s's
    assert ended == [] and watch._joined_s is None
    setup.outcome.mark_joined("gloo")
    watch._watch_for_a_stall(5, began + 61)  # joined now: the clock starts here
    assert ended == [] and watch._joined_s == began + 61
    watch._watch_for_a_stall(5, began + 66.5)  # 5.5 s of no progress since
    assert len(ended) == 1 and ended[0].startswith("stall: no rank completed a collective or a progress step for 6 s")
