"""A checkpoint's copies, each host's own, of which the newest complete one is the one a job resumes from.

A job that outlives its hosts keeps its last checkpoint on every host (runner.training.context), so that losing any
host, host 0 included, loses no checkpoint; and a relaunch of the same run id may find copies of different ages on
its hosts. Each copy therefore carries its **commit record** beside it (``<name>.pt.commit``): the copy's sequence
number (the saves of the run so far, counted on across attempts and relaunches: the newer copy has the higher), the
state's ``step`` where it has one, its size and its inode.

A copy is written whole before it is seen (:func:`write_copy`): into a temporary file of the same folder, synced,
then the commit record is replaced by one that names the new copy *and* the one it replaces, and only then the
temporary file is renamed over the copy. Whatever moment a host dies at, the copy on its disk is complete, and the
record names it: the file's inode and size match the record's ``current`` entry (all done) or its ``previous`` one
(the new copy was not renamed yet; the old one stands). A copy that matches neither, or has no record, is a file of
the runner's before records (or another program's) and counts as the oldest (sequence 0).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from runner.common.files import replaced_atomically, temporary_host
from runner.records.paths import commit_file
from runner.spec.place import RankPlace
from runner.training import checkpoints


@dataclass(frozen=True, order=True)
class CopyRecord:
    """One complete copy of a checkpoint: ``seq`` orders copies (the newest is the highest); ``step`` is its state's
    step (None where the state has none); ``size`` and ``inode`` tell the file it describes."""

    seq: int
    step: int | None
    size: int
    inode: int

    def document(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, entry: object) -> CopyRecord | None:
        if not isinstance(entry, dict):
            return None
        try:
            step = entry.get("step")
            return cls(int(entry["seq"]), int(step) if isinstance(step, int) else None, int(entry["size"]),
                       int(entry["inode"]))
        except (KeyError, TypeError, ValueError):
            return None


def complete_copy(path: Path) -> CopyRecord | None:
    """The complete copy at ``path``, as its commit record describes it; a file without a record that describes it
    is sequence 0 (an older runner's copy, or one put there by hand); None: no file."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    try:
        entries = json.loads(commit_file(path).read_text())
    except (OSError, ValueError):
        entries = {}
    for key in ("current", "previous"):
        found = CopyRecord.of(entries.get(key)) if isinstance(entries, dict) else None
        if found is not None and (found.inode, found.size) == (st.st_ino, st.st_size):
            return found
    return CopyRecord(seq=0, step=None, size=st.st_size, inode=st.st_ino)


def write_copy(path: Path, write: Callable[[Path], None], seq: int, step: int | None) -> CopyRecord:
    """Write the copy at ``path`` whole (``write`` fills the temporary file it is given), recorded as ``seq`` and
    ``step`` (the module docstring says in which order, and why no moment leaves it half seen)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_left_over(path)
    previous = complete_copy(path)
    with replaced_atomically(path, durable=True) as tmp:
        write(tmp)
        st = tmp.stat()
        record = CopyRecord(seq=seq, step=step, size=st.st_size, inode=st.st_ino)
        entries = {"current": record.document(), "previous": previous.document() if previous else None}
        with replaced_atomically(commit_file(path), durable=True) as commit_tmp:
            commit_tmp.write_text(json.dumps(entries))
    return record


def _remove_left_over(path: Path) -> None:
    """The temporary files of copies of ``path`` whose writer on this machine is gone (killed while it wrote or
    received one): ``.<name>.<host>.<pid>.<thread>.tmp`` (runner.common.files), this host's, of no live process."""
    for left in path.parent.glob(f".{path.name}.{temporary_host()}.*.tmp"):
        pid = left.name[:-len(".tmp")].rsplit(".", 2)[-2]
        if pid.isdigit() and not _alive(int(pid)):
            left.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def newest(copies: Sequence[CopyRecord | None]) -> int | None:
    """The index of the newest copy among ``copies`` (one a rank; None: it has none): the highest sequence, then the
    first (two copies of one sequence are one save, sent to every host); None: no copy."""
    held = [(c.seq, -i) for i, c in enumerate(copies) if c is not None]
    return -max(held)[1] if held else None



def _stamp(path: Path) -> tuple[int, int, int] | None:
    """A file's inode, size and modification time (the same file, seen from two hosts that share its folder, has the
    same); None: no file. The inode tells apart two copies of one checkpoint written in the same clock tick (the
    kernel stamps files with a coarse clock: a few ms), which are the same size."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


@dataclass(frozen=True)
class Resumed:
    """The copy a run resumed from: the host that held it (its label), its sequence and its step."""

    host: str
    seq: int
    step: int | None


class Copies:
    """The copies of one process's run's checkpoints: which to write, which to resume from, which to read.

    Every process of the job makes one (its run context does) and calls each method on every process, at the same
    point: they communicate. ``every_host``: a job that outlives its hosts (runner.spec.elastic) keeps each
    checkpoint on every host, not only on rank 0's. ``place``: where this process is; ``device``: where a rank
    receives what it is sent (its GPU under NCCL)."""

    def __init__(self, place: RankPlace, device: torch.device, every_host: bool) -> None:
        self.place, self.device, self.every_host = place, device, every_host
        self.seq: dict[Path, int] = {}  # the last sequence saved or loaded, per checkpoint
        self.resumed: Resumed | None = None  # the copy the run resumed from, once it chose one
        self._groups: dict[tuple[int, ...], Any] = {}  # process groups of the ranks a copy is sent to

    @property
    def distributed(self) -> bool:
        return dist.is_initialized() and self.place.world_size > 1

    def _wire(self) -> torch.device:
        return self.device if dist.get_backend() == dist.Backend.NCCL else torch.device("cpu")

    def _gathered(self, mine: object) -> list[Any]:
        found: list[Any] = [None] * self.place.world_size
        dist.all_gather_object(found, mine)
        return found

    def _held(self, path: Path) -> list[tuple[str, CopyRecord | None] | None]:
        """Each host's copy of ``path``, said by its local rank 0 (host label, record), in rank order; None for the
        other ranks."""
        if not self.distributed:
            return [(self.place.host, complete_copy(path))]
        return self._gathered((self.place.host, complete_copy(path)) if self.place.local_rank == 0 else None)

    # -- saving -------------------------------------------------------------------------------------------------------
    def save(self, path: Path, state: Any, step: int | None) -> None:
        """Rank 0 writes ``state`` (the others' is None) as the next copy of ``path``; with ``every_host``, every
        other host's local rank 0 then writes the same copy, sent by rank 0 (:meth:`_copy_to_every_host`)."""
        if path not in self.seq:  # the first save of this process: count on from the newest copy any host holds
            held = [h[1] for h in self._held(path) if h is not None] if self.every_host or not self.distributed else \
                [complete_copy(path) if self.place.is_main else None]
            self.seq[path] = max((c.seq for c in held if c is not None), default=0)
        self.seq[path] += 1
        if self.place.is_main:
            write_copy(path, lambda tmp: torch.save(state, tmp), self.seq[path], step)
        if self.every_host and self.distributed:
            self._copy_to_every_host(path, step)

    def _copy_to_every_host(self, path: Path, step: int | None) -> None:
        """Every host's local rank 0 whose folder is not rank 0's receives rank 0's new copy in chunks, written to its
        own disk as they come (only those ranks take part: the others hold nothing of it), and records it with rank
        0's sequence and step. Which folders are rank 0's is seen once rank 0's file is there (a barrier first: a rank
        that looked while rank 0 still wrote would see the old file, and take a shared folder for one of its own)."""
        dist.barrier()
        stamps = self._gathered((_stamp(path), step) if self.place.local_rank == 0 else None)
        rank_0, step = stamps[0][0], stamps[0][1]
        short = tuple(r for r, s in enumerate(stamps) if r != 0 and s is not None and s[0] != rank_0)
        if not short:
            return  # one folder for every host
        members = (0, *short)
        group = self._groups.get(members)
        if group is None:  # made by every rank, in the same order (torch's rule for new_group)
            group = self._groups[members] = dist.new_group(list(members))
        if self.place.global_rank == 0:
            checkpoints.broadcast_file(path, self._wire(), src=0, group=group)
        elif self.place.global_rank in short:
            def receive(tmp: Path) -> None:
                with open(tmp, "wb") as into:
                    checkpoints.broadcast_file(None, self._wire(), src=0, group=group, into=into)
            write_copy(path, receive, self.seq[path], step)

    # -- resuming -----------------------------------------------------------------------------------------------------
    def to_resume(self, own: Path, fallback: str | Path | None) -> Path | None:
        """The checkpoint to resume from, the same on every process: the newest copy of ``own`` any host holds (a
        restart, a requeue, a relaunch with the same run id; the host that holds it sends it when loaded), else
        ``fallback`` where rank 0 has it, else None. FileNotFoundError (on every process) where ``fallback`` is given
        and rank 0 has no such file."""
        given = None
        if self.place.is_main and fallback:
            given = ("given" if Path(fallback).exists() else "missing", str(fallback))
        if not self.distributed:
            found = [((self.place.host, complete_copy(own)), given)]
        else:
            found = self._gathered(((self.place.host, complete_copy(own)) if self.place.local_rank == 0 else None,
                                    given))
        held = [h[1] if h is not None else None for h, _ in found]
        at = newest(held)
        if at is not None:
            host, record = found[at][0]
            self.resumed = Resumed(host=host, seq=record.seq, step=record.step)
            return own
        given = found[0][1]
        if given is None:
            return None
        if given[0] == "missing":
            raise FileNotFoundError(f"no checkpoint at {given[1]} (seen from rank 0's host): the fallback to resume "
                                    f"from")
        return Path(given[1])

    # -- reading ------------------------------------------------------------------------------------------------------
    def read(self, path: Path, own: bool) -> Any | None:
        """The checkpoint at ``path`` on every process (None: none): for the run's ``own`` checkpoints, the newest
        copy any host holds; for another file, rank 0's. Read from the file where every process sees that one, else
        sent in chunks by the rank that has it; loaded without running anything from it (runner.training.checkpoints).
        """
        if not self.distributed:
            state = checkpoints.load(path, path, self.device) if path.exists() else None
            self._loaded(path, complete_copy(path) if own else None)
            return state
        mine = (_stamp(path), complete_copy(path) if own and self.place.local_rank == 0 else None)
        found = self._gathered(mine)
        at = newest([record for _, record in found]) if own else None
        src = at if at is not None else 0
        if found[src][0] is None:
            return None
        self._loaded(path, found[src][1])
        if all(stamp == found[src][0] for stamp, _ in found):
            return checkpoints.load(path, path, self.device)
        received = checkpoints.broadcast_file(path if self.place.global_rank == src else None, self._wire(), src=src)
        if received is None:  # the sender: its own file
            return checkpoints.load(path, path, self.device)
        return checkpoints.load(received, f"{path} (sent by rank {src})", self.device)

    def _loaded(self, path: Path, record: CopyRecord | None) -> None:
        """Saves after a load count on from the copy loaded."""
        if record is not None:
            self.seq[path] = max(self.seq.get(path, 0), record.seq)
