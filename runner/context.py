"""What a recipe sees: its place in the job, the device, and the runner's services.

A recipe receives a :class:`RunContext` and its own config, and never imports launcher internals.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from runner.spec import ParallelMode


@dataclass(frozen=True)
class Place:
    """A process's place in the job."""

    rank: int
    local_rank: int
    node_rank: int
    world_size: int
    local_world_size: int
    host: str


class RunContext:
    """Rank, device, wrapping, data, metrics and checkpoints for one process of a job."""

    def __init__(self, place: Place, device: torch.device, device_ids: tuple[int, ...], parallel: ParallelMode,
                 global_batch_size: int | None, seed: int, output_dir: Path, find_unused_parameters: bool = False,
                 bucket_cap_mb: float = 25.0) -> None:
        self.place = place
        self.device = device
        self._device_ids = device_ids
        self._parallel = parallel
        self.global_batch_size = global_batch_size
        self.seed = seed
        self.output_dir = output_dir
        self._ddp_options = {"find_unused_parameters": find_unused_parameters, "bucket_cap_mb": bucket_cap_mb}
        self._metrics_file = None
        self._t0 = time.perf_counter()

    # -- where am I -------------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.place.rank

    @property
    def local_rank(self) -> int:
        return self.place.local_rank

    @property
    def world_size(self) -> int:
        return self.place.world_size

    @property
    def is_main(self) -> bool:
        return self.place.rank == 0

    @property
    def per_process_batch_size(self) -> int:
        """Global batch / world size (validated to divide); DP keeps the global batch in its one process."""
        if self.global_batch_size is None:
            raise ValueError("recipe.global_batch_size is not set: the recipe's config must give one")
        return self.global_batch_size // self.world_size

    # -- model --------------------------------------------------------------------------------------
    def wrap(self, model: nn.Module) -> nn.Module:
        """Move the model to this process's device and wrap it as the spec says (DDP or DP)."""
        model = model.to(self.device)
        if self._parallel is ParallelMode.dp:
            if self.device.type == "cuda" and len(self._device_ids) > 1:
                return nn.DataParallel(model, device_ids=list(self._device_ids))
            return model
        if self.world_size == 1:
            return model
        ids = [self.device.index] if self.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids, **self._ddp_options)

    @staticmethod
    def unwrap(model: nn.Module) -> nn.Module:
        """The plain module inside a DDP/DP wrapper (what checkpoints hold)."""
        return model.module if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)) else model

    # -- data ---------------------------------------------------------------------------------------
    def loader(self, dataset: Dataset, *, shuffle: bool = True, drop_last: bool = True, **kwargs: Any) -> DataLoader:
        """A loader of this process's share of each global batch.

        Global batch b is dataset[perm[b*G:(b+1)*G]] (perm seeded by seed + epoch) whatever the
        world size: rank r takes every world_size-th index, so the ranks' per-process batches of
        G / world_size together form exactly that global batch. Call ``loader.sampler.set_epoch(e)``
        each epoch. Incomplete global batches are dropped (``drop_last``) so that every topology
        takes the same steps.
        """
        sampler = DistributedSampler(dataset, num_replicas=self.world_size, rank=self.rank, shuffle=shuffle,
                                     seed=self.seed, drop_last=drop_last)
        return DataLoader(dataset, batch_size=self.per_process_batch_size, sampler=sampler, drop_last=drop_last,
                          **kwargs)

    # -- collectives --------------------------------------------------------------------------------
    def mean(self, value: float | torch.Tensor) -> float:
        """The mean of a scalar over all processes."""
        t = torch.as_tensor(value, dtype=torch.float64, device="cpu" if self.device.type == "cpu" else self.device)
        if dist.is_initialized() and self.world_size > 1:
            dist.all_reduce(t)
            t /= self.world_size
        return float(t)

    def barrier(self) -> None:
        if dist.is_initialized() and self.world_size > 1:
            dist.barrier()

    # -- metrics ------------------------------------------------------------------------------------
    def log(self, step: int, *, echo: bool = True, **metrics: float) -> None:
        """Record metrics of the main process as one JSON line in metrics.jsonl (others: no-op)."""
        if not self.is_main:
            return
        row = {"step": step, "time_s": round(time.perf_counter() - self._t0, 4), **metrics}
        if self._metrics_file is None:
            self._metrics_file = open(self.output_dir / "metrics.jsonl", "a", buffering=1)
        self._metrics_file.write(json.dumps(row) + "\n")
        if echo:
            shown = " ".join(f"{k}={_fmt(v)}" for k, v in metrics.items())
            print(f"step {step}: {shown}", flush=True)

    # -- checkpoints --------------------------------------------------------------------------------
    @property
    def checkpoint_dir(self) -> Path:
        return self.output_dir / "checkpoints"

    def save_checkpoint(self, state: dict[str, Any], name: str = "last") -> Path:
        """The main process writes ``state`` atomically to checkpoints/<name>.pt; every process waits for it."""
        path = self.checkpoint_dir / f"{name}.pt"
        if self.is_main:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".pt.tmp")
            torch.save(state, tmp)
            os.replace(tmp, path)
        self.barrier()
        return path

    def load_checkpoint(self, name: str = "last", path: str | Path | None = None) -> dict[str, Any] | None:
        """A saved state, mapped onto this process's device; None when there is none."""
        path = Path(path) if path is not None else self.checkpoint_dir / f"{name}.pt"
        if not path.exists():
            return None
        return torch.load(path, map_location=self.device, weights_only=False)

    def close(self) -> None:
        if self._metrics_file is not None:
            self._metrics_file.close()
        sys.stdout.flush()


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def parameters_of(model: nn.Module) -> Iterable[nn.Parameter]:
    return RunContext.unwrap(model).parameters()
