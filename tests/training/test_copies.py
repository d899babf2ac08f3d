"""runner.training.copies: each copy of a checkpoint records its save's sequence and step; a copy is complete whatever
moment its writer stops at; the newest copy any host holds is the one resumed, and saves count on from it. The
last test runs real processes (gloo), each its host's local rank 0 with a run folder of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from runner.common.files import temporary_host
from runner.records.paths import commit_file
from runner.training.copies import CopyRecord, complete_copy, newest, write_copy


def _save(path, value, seq, step=None) -> CopyRecord:
    return write_copy(path, lambda tmp: torch.save({"v": value}, tmp), seq, step)


def test_a_copy_records_its_save_and_step_and_the_one_it_replaced(tmp_path) -> None:
    path = tmp_path / "ck" / "last.pt"
    first = _save(path, 1, seq=1, step=10)
    second = _save(path, 2, seq=2, step=20)
    assert complete_copy(path) == second and (second.seq, second.step) == (2, 20)
    entries = json.loads(commit_file(path).read_text())
    assert CopyRecord.of(entries["previous"]) == first
    assert torch.load(path)["v"] == 2


def test_a_writer_stopped_before_its_rename_leaves_the_last_complete_copy_named(tmp_path) -> None:
    """The commit record already names the new copy, which was not renamed into place: the file on disk is the old
    one, which the record's previous entry names."""
    path = tmp_path / "last.pt"
    old = _save(path, 1, seq=4, step=40)
    entries = {"current": {"seq": 5, "step": 50, "size": 123, "inode": old.inode + 1}, "previous": old.document()}
    commit_file(path).write_text(json.dumps(entries))
    assert complete_copy(path) == old


def test_a_writer_that_fails_leaves_the_copy_and_its_record_as_they_were(tmp_path) -> None:
    path = tmp_path / "last.pt"
    old = _save(path, 1, seq=1, step=10)

    def broken(tmp):
        tmp.write_bytes(b"half a checkpoint")
        raise ConnectionError("the sender is gone")

    with pytest.raises(ConnectionError):
        write_copy(path, broken, seq=2, step=20)
    assert complete_copy(path) == old and torch.load(path)["v"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "last.pt.commit"]  # no temporary file left


def test_a_copy_left_half_written_by_a_killed_writer_goes_and_one_being_written_stays(tmp_path) -> None:
    """Temporary files of this machine: of a process that is gone (a receiver killed mid-copy), removed by the next
    write; of a live one (another rank writing its own copy into a shared folder), kept."""
    path = tmp_path / "last.pt"
    dead = subprocess.Popen(["true"])
    dead.wait()
    gone = tmp_path / f".last.pt.{temporary_host()}.{dead.pid}.1.tmp"
    writing = tmp_path / f".last.pt.{temporary_host()}.{os.getpid()}.1.tmp"
    for f in (gone, writing):
        f.write_bytes(b"part of a checkpoint")
    _save(path, 1, seq=1)
    assert not gone.exists() and writing.exists()


def test_a_file_without_a_record_is_the_oldest_copy(tmp_path) -> None:
    path = tmp_path / "last.pt"
    torch.save({"v": 0}, path)
    assert complete_copy(path).seq == 0 and complete_copy(tmp_path / "none.pt") is None


def test_the_newest_copy_is_the_highest_save_then_the_first_host() -> None:
    a, b = CopyRecord(3, 30, 10, 1), CopyRecord(5, 50, 10, 2)
    assert newest([None, a, b, None]) == 2 and newest([b, a, b]) == 0 and newest([None, None]) is None


RESUME = """
import sys, torch, torch.distributed as dist
from pathlib import Path
from runner.spec.place import RankPlace
from runner.spec.schema import ParallelConfig, ShardingConfig
from runner.training.context import ContextSettings, RunContext
from runner.training.copies import complete_copy
rank, folder = int(sys.argv[1]), Path(sys.argv[2])
dist.init_process_group("gloo", init_method=f"file://{folder / 'rdzv'}", rank=rank, world_size=2)
own = folder / f"host{rank}"
place = RankPlace(global_rank=rank, local_rank=0, node_rank=rank, world_size=2, local_world_size=1, host=f"h{rank}",
                  device="cpu", device_ids=())
ctx = RunContext(ContextSettings(place=place, parallel=ParallelConfig(), sharding=ShardingConfig(), global_batch_size=8,
                                 seed=7, output_dir=own, metrics_file=own / "metrics.jsonl",
                                 checkpoint_dir=own / "checkpoints", keep_on_every_host=True))
found = ctx.checkpoint_to_resume()
state = ctx.load_checkpoint(path=found)
ctx.save_checkpoint({"step": state["step"] + 1, "w": state["w"] + 1 if rank == 0 else None})
record = complete_copy(own / "checkpoints" / "last.pt")
print(found.name, state["step"], record.seq, record.step, torch.load(own / "checkpoints" / "last.pt")["w"].sum().item())
dist.destroy_process_group()
"""


def test_the_newest_copy_on_any_host_is_resumed_and_saves_count_on_from_it(tmp_path) -> None:
    """Host 1 holds save 7 (step 70), host 0 save 3 (step 30), as after a relaunch of the run whose host 0 had been
    lost: both ranks resume from host 1's (sent by rank 1), and the next save is save 8 (step 71) on both hosts."""
    for rank, (seq, step) in enumerate(((3, 30), (7, 70))):
        _save_state(tmp_path / f"host{rank}" / "checkpoints" / "last.pt", {"step": step, "w": torch.full((4,), step)},
                    seq, step)
    procs = [subprocess.Popen([sys.executable, "-c", RESUME, str(rank), str(tmp_path)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    said = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], said
    assert [out.split() for out, _ in said] == [["last.pt", "70", "8", "71", "284"]] * 2  # 4 x (70 + 1)


def _save_state(path, state, seq, step) -> None:
    write_copy(path, lambda tmp: torch.save(state, tmp), seq, step)
