"""runner.reports.hangs: the paragraph of a hang and the straggler, from the ranks' dumps (no processes); and why
it does not use torch's flight-recorder analyzer (a gloo dump it cannot read)."""

from __future__ import annotations

import pytest

from runner.records.dumps import Collective, GroupRecord, RankDump
from runner.reports.hangs import diagnose, straggler

NOW = 1000.0


def dump(rank: int, enqueued: int, ops: dict[int, str] | None = None, at: str = "", group: str = "0",
         entered: dict[int, float] | None = None, host: str = "node0") -> RankDump:
    ops = ops or {}
    entries = tuple(Collective(s, ops.get(s, "all_reduce"), ((4,),), ("Float",), (entered or {}).get(s, NOW - 15.0))
                    for s in range(max(1, enqueued - 3), enqueued + 1))
    return RankDump(rank, host, NOW, "timeout", "flight recorder", (GroupRecord(group, enqueued, -1, entries),), at)


@pytest.mark.unit
def test_ranks_waiting_and_a_rank_that_never_entered() -> None:
    dumps = {0: dump(0, 21), 1: dump(1, 21), 2: dump(2, 20, at="train.py:57 in main"), 3: dump(3, 21)}
    found = diagnose(dumps, 4)
    assert found.text == ("ranks 0,1,3 wait in all_reduce #21 (process group 0) since 15.0 s (Float[4]); rank 2 never "
                          "entered it: its last collective was all_reduce #20, and it is at train.py:57 in main")
    assert (found.seq, found.op, found.waiting, found.absent, found.silent) == (21, "all_reduce", (0, 1, 3), (2,), ())



@pytest.mark.unit
def test_the_hosts_of_the_ranks_behind_and_of_those_waiting() -> None:
    """What the rule that leaves out a host that hangs the job twice reads (runner.worker.hung_hosts): the hosts of
    the ranks that never entered the collective or cannot answer, and the hosts of those in it."""
    dumps = {0: dump(0, 21, host="a"), 1: dump(1, 21, host="b"), 2: dump(2, 20, host="c"), 3: dump(3, 21, host="c")}
    found = diagnose(dumps, 4)
    assert (found.behind_hosts, found.waiting_hosts) == (("c",), ("a", "b", "c"))
    stuck = RankDump(3, "d", NOW, "stall", "host agent", stuck="its watch has not run for 9 s (the GIL is held)")
    found = diagnose({0: dump(0, 21, host="a"), 1: dump(1, 21, host="b"), 3: stuck}, 4)
    assert (found.behind_hosts, found.waiting_hosts, found.silent) == (("d",), ("a", "b"), (2,))
    assert found.document()["behind_hosts"] == ["d"] and found.document()["waiting_hosts"] == ["a", "b"]

@pytest.mark.unit
def test_different_collectives_at_the_same_number() -> None:
    dumps = {0: dump(0, 21), 1: dump(1, 21, {21: "broadcast"}), 2: dump(2, 21), 3: dump(3, 21)}
    found = diagnose(dumps, 4)
    assert found.text == ("rank 1 entered broadcast #21 (Float[4]) while ranks 0,2,3 entered all_reduce #21 (Float[4]) "
                          "(process group 0)")
    placed = {0: dump(0, 21, at="train.py:40 in main"), 1: dump(1, 21, {21: "broadcast"}, at="train.py:37 in main"),
              2: dump(2, 21, at="train.py:40 in main")}
    assert diagnose(placed, 3).text == ("rank 1 entered broadcast #21 (Float[4]) while ranks 0,2 entered all_reduce #21 "
                                        "(Float[4]) (process group 0); ranks 0,2 are at train.py:40 in main, rank 1 is "
                                        "at train.py:37 in main")
    assert found.mismatched == {"all_reduce": (0, 2, 3), "broadcast": (1,)}


@pytest.mark.unit
def test_a_rank_that_said_nothing_and_one_that_never_made_a_collective() -> None:
    found = diagnose({0: dump(0, 2), 1: dump(1, 0)}, 3)
    assert found.text == ("rank 0 waits in all_reduce #2 (process group 0) since 15.0 s (Float[4]); rank 1 never "
                          "entered it: its last collective was none; rank 2 said nothing (gone, or on a host whose run "
                          "folder is not this one)")
    assert diagnose({0: dump(0, 0)}, 1) is None and diagnose({}, 2) is None


@pytest.mark.unit
def test_the_group_the_ranks_are_furthest_apart_in() -> None:
    a = RankDump(0, "n", NOW, "t", "fr", (GroupRecord("0", 5, -1, ()), GroupRecord("3", 9, -1, ())))
    b = RankDump(1, "n", NOW, "t", "fr", (GroupRecord("0", 5, -1, ()), GroupRecord("3", 7, -1, ())))
    found = diagnose({0: a, 1: b}, 2)
    assert (found.group, found.seq, found.absent) == ("3", 9, (1,))
    assert found.text.startswith("rank 0 waits in ? #9 (process group 3)")


def _timed(rank: int, per_step: float, late: float, steps: int = 12) -> RankDump:
    entered = {s: s * per_step + late for s in range(1, steps + 1)}
    entries = tuple(Collective(s, "all_reduce", entered_s=t) for s, t in entered.items())
    return RankDump(rank, f"node{rank // 2}", NOW, "end", "flight recorder", (GroupRecord("0", steps, steps, entries),))


@pytest.mark.unit
def test_the_rank_the_others_waited_for() -> None:
    # every rank works 1.0 s between collectives but rank 3, which works 1.4 s (and so enters each 0.4 s later)
    dumps = {r: _timed(r, 1.4, 0.4) if r == 3 else _timed(r, 1.4, 0.0) for r in range(4)}
    slow = straggler(dumps)
    assert (slow.rank, slow.host, slow.collectives) == (3, "node1", 11)
    assert slow.ratio == pytest.approx(1.4 / 1.0, rel=1e-6) and slow.waited_s == pytest.approx(11 * 0.4)
    assert slow.text() == ("rank 3 on node1: 1.40x the median step time; the others waited 4.4 s for it over the last "
                           "11 collectives")


@pytest.mark.unit
def test_no_straggler_among_equals_or_with_too_little_to_tell() -> None:
    assert straggler({r: _timed(r, 0.1, 0.001 * r) for r in range(4)}) is None
    assert straggler({r: _timed(r, 0.1, 0.05 if r else 0.0, steps=4) for r in range(2)}) is None
    assert straggler({0: _timed(0, 0.1, 0.0)}) is None


@pytest.mark.unit
def test_no_straggler_where_the_others_waited_too_little_to_matter() -> None:
    """A 1.5-second job whose slow rank is 1.4x slower, but made the others wait 0.44 s in all: nothing to act on
    (the same shape ten times slower is the straggler above)."""
    short = {r: _timed(r, 0.14, 0.04) if r == 3 else _timed(r, 0.14, 0.0) for r in range(4)}
    assert straggler(short) is None
    assert straggler(short, min_waited_s=0.4).rank == 3


# ---------------------------------------------------------------------------------- torch's own analyzer


ANALYZER = """
import os, pickle, tempfile
os.environ["TORCH_FR_BUFFER_SIZE"] = "20"
import torch, torch.distributed as dist
from torch.distributed.flight_recorder.components.builder import build_db
from torch.distributed.flight_recorder.components.config_manager import JobConfig
dist.init_process_group("gloo", init_method="file://" + os.path.join(tempfile.mkdtemp(), "rdzv"), rank=0, world_size=1)
dist.all_reduce(torch.ones(3))
dump = pickle.loads(torch._C._distributed_c10d._dump_fr_trace(True, False))
dist.destroy_process_group()
print(sorted(dump["pg_config"]), dump["entries"][0]["process_group"])
rank0 = {"host_name": "h", "rank": 0, "entries": dump["entries"], "version": dump["version"],
         "pg_config": dump["pg_config"]}
try:
    build_db({"rank0": rank0}, JobConfig().parse_args(["."]), dump["version"])
    print("read")
except KeyError as e:
    print("KeyError", e)
"""


# not marked unit: it starts a process with a process group (the suite, not `pytest -m unit`, runs it)
def test_torchs_flight_recorder_analyzer_cannot_read_a_gloo_dump() -> None:
    """Why runner.reports.hangs matches the ranks' dumps itself (its docstring): torch's analyzer stops at a gloo
    rank's buffer, whose process group it cannot find. Once this fails, torch reads one: see whether it can serve."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-P", "-c", ANALYZER], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == ["[''] ('0', 'default_pg')", "KeyError ('0', 0)"], done.stdout
