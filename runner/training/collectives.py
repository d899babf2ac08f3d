"""The run context's small collectives (``ctx.mean``, ``ctx.barrier``, the agreement of ``ctx.should_stop``): each a
no-op at world size 1 or without a process group, so that a recipe calls them the same way everywhere."""

from __future__ import annotations

import torch
import torch.distributed as dist


class Collectives:
    """Collectives over the job's processes, from this one: ``device`` is its own (a CUDA process's tensors travel on
    its GPU, as NCCL needs; a CPU process's on the CPU)."""

    def __init__(self, device: torch.device, world_size: int) -> None:
        self._wire = torch.device("cpu") if device.type == "cpu" else device
        self._world_size = world_size

    @property
    def _shared(self) -> bool:
        return dist.is_initialized() and self._world_size > 1

    def mean(self, value: float | torch.Tensor) -> float:
        """The mean of a scalar over all processes."""
        t = torch.as_tensor(value, dtype=torch.float64, device=self._wire)
        if self._shared:
            dist.all_reduce(t)
            t /= self._world_size
        return float(t)

    def barrier(self) -> None:
        """Wait for every process."""
        if self._shared:
            dist.barrier()

    def any_of(self, flag: bool) -> bool:
        """Whether ``flag`` is set on any process (every process gets the same answer)."""
        t = torch.tensor([1.0 if flag else 0.0], device=self._wire)
        if self._shared:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())
