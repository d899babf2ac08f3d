"""runner.training.checkpointing: one process's checkpoints, saved and read through its copies, a model's full state
gathered and loaded by its strategy, and the copy a run resumes from told to its host agent (the context's calls of
it: test_context.py; several ranks and hosts: test_checkpoints_on_every_host.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from runner.spec.place import RankPlace
from runner.training.checkpointing import Checkpointing
from runner.training.copies import Copies
from runner.training.sharding import Placement, strategy_for


PLACE = RankPlace(global_rank=0, local_rank=0, node_rank=0, world_size=1, local_world_size=1, host="a", device="cpu",
                  device_ids=())


class _Agent:
    """The host agent's channel, as far as resuming goes: what it was told."""

    def __init__(self) -> None:
        self.told: list[tuple[str, int, int | None]] = []

    def resumed_copy(self, host: str, seq: int, step: int | None) -> None:
        self.told.append((host, seq, step))


def _checkpointing(folder: Path, agent: _Agent | None = None) -> tuple[Checkpointing, list[str]]:
    waits: list[str] = []
    strategy = strategy_for(Placement(place=PLACE))
    return Checkpointing(folder, Copies(PLACE, torch.device("cpu"), False), is_main=True, agent=agent,
                         sharding=lambda: strategy, barrier=lambda: waits.append("barrier")), waits


def test_a_save_writes_the_state_with_the_models_full_state_and_waits_for_every_process(tmp_path) -> None:
    checkpoints, waits = _checkpointing(tmp_path / "ck")
    model = nn.Linear(2, 1)
    path = checkpoints.save({"step": 3}, "last", model, None)
    assert path == tmp_path / "ck" / "last.pt" and waits == ["barrier"]
    saved = torch.load(path, weights_only=True)
    assert saved["step"] == 3 and torch.equal(saved["model"]["weight"], model.weight.detach())


def test_a_load_fills_the_model_and_returns_the_other_entries(tmp_path) -> None:
    checkpoints, _ = _checkpointing(tmp_path / "ck")
    assert checkpoints.load("last", None, None, None) is None  # none saved yet
    saved = nn.Linear(2, 1)
    checkpoints.save({"step": 5}, "last", saved, None)
    fresh = nn.Linear(2, 1)
    assert checkpoints.load("last", None, fresh, None) == {"step": 5}
    assert torch.equal(fresh.weight, saved.weight)


def test_the_copy_resumed_from_is_told_to_the_host_agent(tmp_path) -> None:
    agent = _Agent()
    checkpoints, _ = _checkpointing(tmp_path / "ck", agent)
    assert checkpoints.to_resume(None, "last") is None and agent.told == []
    checkpoints.save({"step": 7}, "last", None, None)
    assert checkpoints.to_resume(None, "last") == tmp_path / "ck" / "last.pt"
    assert agent.told == [("a", 1, 7)]
