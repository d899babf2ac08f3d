"""How a rank reads a checkpoint: without running anything from the file, and, on a host that does not see rank 0's
file, sent by rank 0 in bounded chunks (runner.training.context: ``ctx.load_checkpoint``).

Safely: ``torch.load(weights_only=True)``. A pickle can name any function to call while it loads (``os.system``
included), and ``recipe.resume`` is a path anyone may hand a job. The runner's checkpoints (``ctx.save_checkpoint``
under every sharding mode: the plain module's ``state_dict()`` and an unsharded optimizer's, beside the recipe's
own entries) hold tensors, dicts, OrderedDicts, lists, tuples, ints, floats, bools, strings and None: all of them
in torch's own allow-list, so the runner adds no type to it (checked by saving with none, oss, sdp, zero and fsdp).
A file that holds anything else is refused with :class:`CheckpointError`, which names the file and the types;
a recipe that means to keep such a type in its checkpoints allows it itself, with torch's public
``torch.serialization.add_safe_globals``.

Chunked: a checkpoint can be gigabytes, and pickling it whole as one object for ``broadcast_object_list`` holds
several copies of it on every rank at once; :func:`broadcast_file` sends its size, then at most
:data:`CHUNK_BYTES` per ``dist.broadcast`` (``benchmarks/checkpoint_broadcast.py`` measures the difference).
"""

from __future__ import annotations

import io
import pickle
import re
from pathlib import Path
from typing import Any, BinaryIO

import torch
import torch.distributed as dist

CHUNK_BYTES = 64 * 2**20  # per broadcast: what a rank holds of the checkpoint beyond its own copy


class CheckpointError(Exception):
    """A checkpoint file that the runner will not load: it is not a plain checkpoint, or rank 0 could not read it."""


def load(source: Path | io.RawIOBase, shown: str | Path, device: torch.device) -> Any:
    """The checkpoint in ``source`` (a path, or the bytes rank 0 sent), its tensors on ``device``, loaded with
    ``weights_only=True``; :class:`CheckpointError` naming ``shown`` when it holds anything but plain data."""
    try:
        return torch.load(source, map_location=device, weights_only=True)
    except pickle.UnpicklingError as e:
        held = _unsafe_globals(source)
        what = (f"it holds {', '.join(held)}" if held else
                f"it holds something torch's safe loader does not read ({_unpickler_detail(e)})")
        allow = f"[{', '.join(held)}]" if held else "[TheType]"
        raise CheckpointError(
            f"checkpoint {shown} is not a plain checkpoint: {what}; loading it would have to import and call code "
            f"named in the file, so it was refused and nothing in it was run (torch.load with weights_only=True); "
            f"hint: save checkpoints as tensors, dicts, lists, tuples, numbers and strings (a state_dict() is "
            f"one) and save this one again that way; or, if you trust the file, allow its types before "
            f"ctx.load_checkpoint: torch.serialization.add_safe_globals({allow})") from None


def _unsafe_globals(source: Path | io.RawIOBase) -> list[str]:
    """The functions and classes a ``torch.save`` file names that are not allowed (read without running any);
    [] for a file in another format (a plain pickle), whose refusal says what it met first."""
    if not isinstance(source, Path):
        source.seek(0)
    try:
        return sorted(torch.serialization.get_unsafe_globals_in_checkpoint(source))
    except (ValueError, RuntimeError, pickle.UnpicklingError):
        return []


def _unpickler_detail(error: pickle.UnpicklingError) -> str:
    """What torch's safe unpickler met, from its message (the rest of which is advice to load unsafely)."""
    found = re.search(r"WeightsUnpickler error:\s*(.+?)(?:\n\n|$)", str(error), re.S)
    return " ".join(found.group(1).split()) if found else str(error).splitlines()[0]


class _Received(io.RawIOBase):
    """A seekable, read-only file over bytes received into a tensor: torch.load reads it in place (``readinto``),
    where ``io.BytesIO`` would first copy all of it."""

    def __init__(self, data: torch.Tensor) -> None:
        super().__init__()
        self._view = memoryview(data.numpy()).cast("B")
        self._data = data  # keeps the memory alive as long as the view
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = max(0, min(len(buffer), len(self._view) - self._pos))
        memoryview(buffer).cast("B")[:n] = self._view[self._pos:self._pos + n]
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos


def broadcast_file(path: Path | None, wire: torch.device, chunk_bytes: int = CHUNK_BYTES, *, src: int = 0,
                   group: dist.ProcessGroup | None = None, into: BinaryIO | None = None) -> io.RawIOBase | None:
    """Rank ``src`` (``path``): send the file to every rank of ``group`` (the default group: None), its size first,
    then at most ``chunk_bytes`` per broadcast; None. The other ranks (``path`` None): a file over the bytes
    received, or, with ``into``, each chunk written there as it comes (nothing held beyond a chunk); None then.
    ``wire``: where the chunks travel (the device for NCCL, which sends no CPU tensors; the CPU otherwise)."""
    sender = path is not None
    size = torch.tensor([-1], dtype=torch.int64, device=wire)
    source = None
    if sender:
        try:
            source = open(path, "rb")
            size[0] = Path(path).stat().st_size
        except OSError as e:
            problem = e  # said on the sender after the size (-1) tells the others to give up too
    dist.broadcast(size, src=src, group=group)
    n = int(size.item())
    if n < 0:
        raise CheckpointError(f"rank {src} could not read checkpoint {path}: {problem.strerror}" if sender else
                              f"rank {src} could not read the checkpoint it was to send (its log says why)")
    staging = torch.empty(min(n, chunk_bytes), dtype=torch.uint8) if sender or into is not None else None
    on_wire = None if wire.type == "cpu" else torch.empty(min(n, chunk_bytes), dtype=torch.uint8, device=wire)
    received = None if sender or into is not None else torch.empty(n, dtype=torch.uint8)
    try:
        for start in range(0, n, chunk_bytes):
            count = min(chunk_bytes, n - start)
            if sender:
                _read_exactly(source, memoryview(staging.numpy())[:count], path)
                chunk = staging[:count]
            else:  # received in place (no copy on the CPU), or into the staging buffer, then written
                chunk = received[start:start + count] if received is not None else staging[:count]
            if on_wire is None:
                dist.broadcast(chunk, src=src, group=group)
            else:
                if sender:
                    on_wire[:count].copy_(chunk)
                dist.broadcast(on_wire[:count], src=src, group=group)
                if not sender:
                    chunk.copy_(on_wire[:count])
            if into is not None and not sender:
                into.write(memoryview(chunk.numpy()).cast("B"))
    finally:
        if source is not None:
            source.close()
    return None if sender or into is not None else _Received(received)


def _read_exactly(source: BinaryIO, into: memoryview, path: Path) -> None:
    done = 0
    while done < len(into):
        got = source.readinto(into[done:])
        if not got:
            raise CheckpointError(f"checkpoint {path} became shorter while rank 0 was sending it (is something "
                                  f"writing it?)")
        done += got
