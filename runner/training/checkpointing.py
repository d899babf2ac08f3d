"""A run context's checkpoints (``ctx.save_checkpoint``, ``ctx.checkpoint_to_resume``, ``ctx.load_checkpoint``):
the full state of a sharded model gathered by its strategy (runner.training.sharding), the file written and read
through its copies on the hosts (runner.training.copies), and what the host agent is told of the copy a run
resumes from."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn
from torch.optim import Optimizer

from runner.records.paths import checkpoint_file
from runner.training.copies import Copies
from runner.training.output import AgentChannel
from runner.training.sharding import Strategy


class Checkpointing:
    """The checkpoints of one process of a run, in ``folder`` (the run's checkpoints/). Every method is called on
    every process: saving gathers a sharded model's state and waits for the main process's write (``barrier``), and
    resuming agrees on one copy over all of them. ``sharding``: the context's strategy, made when first needed."""

    def __init__(self, folder: Path, copies: Copies, *, is_main: bool, agent: AgentChannel | None,
                 sharding: Callable[[], Strategy], barrier: Callable[[], None]) -> None:
        self.folder = folder
        self._copies = copies
        self._is_main = is_main
        self._agent = agent
        self._sharding = sharding
        self._barrier = barrier

    def save(self, state: dict[str, Any] | None, name: str, model: nn.Module | None,
             optimizer: Optimizer | None) -> Path:
        """``state``, with the full state of ``model`` and ``optimizer`` where given, written by the main process as
        checkpoints/<name>.pt (and its commit record: the save's sequence and ``state``'s integer ``"step"``)."""
        path = checkpoint_file(self.folder, name)
        if model is not None:
            full = self._sharding().full_state(model, optimizer, copy=False)  # written at once: no snapshot needed
            state = {**(state or {}), **full} if full is not None else None
        step = state.get("step") if isinstance(state, dict) else None
        self._copies.save(path, state, step if isinstance(step, int) and not isinstance(step, bool) else None)
        self._barrier()
        return path

    def to_resume(self, fallback: str | Path | None, name: str) -> Path | None:
        """The run's own checkpoint (its newest copy on any host), else ``fallback``; the main process tells its host
        agent which copy that was, for `run`'s summary."""
        found = self._copies.to_resume(checkpoint_file(self.folder, name), fallback)
        resumed = self._copies.resumed
        if resumed is not None and self._is_main and self._agent is not None:
            self._agent.resumed_copy(resumed.host, resumed.seq, resumed.step)
        return found

    def load(self, name: str, path: str | Path | None, model: nn.Module | None,
             optimizer: Optimizer | None) -> dict[str, Any] | None:
        """The checkpoint at ``path`` (else the run's own ``name``), with its full state loaded into ``model`` and
        ``optimizer`` where given (and left out of what is returned); None where there is none."""
        path = Path(path) if path is not None else checkpoint_file(self.folder, name)
        state = self._copies.read(path, own=path.parent == self.folder)
        if state is None:
            return None
        if model is not None:
            self._sharding().load_full_state(model, optimizer, state)
            state = {k: v for k, v in state.items() if k not in ("model", "optimizer")}
        return state
