"""sharding=oss/sdp/zero/fsdp end to end: real `run` processes and gloo groups on CPU.

* Equivalence: with the same seed and global batch, the weights (and Adam's moments) after N steps
  equal the unsharded DDP run's at 1x2 and 1x4, within float tolerance.
* Memory: each process's optimizer state, measured in the run (ctx.optimizer_state_bytes), is
  about 1/world size of the unsharded run's, and the shards add up to it.
* Checkpoints: the consolidated state of one mode and world size resumes under another.
* The run context itself (no process group): ctx.wrap refuses to shard, world size 1 is plain.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from runs import artifacts, run, run_folder
from runner.training.context import ContextSettings, RunContext
from runner.training.sharding import _by_index, _by_name, default_shard_units, state_bytes
from runner.spec.place import RankPlace
from runner.spec.schema import ParallelConfig, ParallelMode, ShardingConfig, ShardingMode

pytestmark = pytest.mark.timeout(300)
# the tests that build an optimizer in this process (its first import of torch._dynamo, 0.9 CPU-s, only where one is built)
builds_optimizers = pytest.mark.usefixtures("optimizers_imported")

STEPS = 12
# 8 hidden 48x48 layers: ~20k parameters in tensors of equal size, so per-tensor partitions balance
MODEL = ("+recipe.width=48", "+recipe.depth=8", "+recipe.lr=0.01", "recipe.global_batch_size=32")
SHAPES = {"1x1": 1, "1x2": 2, "1x4": 4}
SHARDED = ("oss", "sdp", "zero", "fsdp")
EXPECTED_TYPES = {  # (model wrapper, optimizer) each mode must really have used
    "none": ("DistributedDataParallel", "Adam"),
    "oss": ("DistributedDataParallel", "OSS"),
    "sdp": ("ShardedDataParallel", "OSS"),
    "zero": ("DistributedDataParallel", "ZeroRedundancyOptimizer"),
    "fsdp": ("FSDPSequential", "Adam"),
}


class Trainer:
    """Runs the `sharded` workload once per (mode, shape, resume) and remembers what it left."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.done: dict[tuple, dict] = {}

    def __call__(self, mode: str, shape: str, *, steps: int = STEPS, resume: Path | None = None,
                 groups: bool = False) -> dict:
        key = (mode, shape, steps, str(resume), groups)
        if key not in self.done:
            cwd = self.root / f"{mode}-{shape}-{len(self.done)}"
            out = cwd / "out"
            out.mkdir(parents=True)
            extra = ([f"+recipe.resume={resume}"] if resume else []) + (["+recipe.groups=true"] if groups else [])
            done = run(f"topology={shape}", f"sharding={mode}", "recipe=custom", "recipe.target=workloads.sharded:main",
                       f"+recipe.out_dir={out}", f"+recipe.steps={steps}", *MODEL, *extra, cwd=cwd)
            assert done.code == 0, done.output
            records = artifacts(out)
            assert sorted(records) == list(range(SHAPES[shape])), records
            self.done[key] = {"records": records, "final": torch.load(out / "final.pt"),
                              "loaded": torch.load(out / "loaded.pt") if resume else None,
                              "checkpoint": run_folder(cwd) / "checkpoints" / "last.pt"}
        return self.done[key]


@pytest.fixture(scope="module")
def train(tmp_path_factory) -> Trainer:
    return Trainer(tmp_path_factory.mktemp("sharding"))


def assert_same_state(got: dict, ref: dict, *, exact: bool = False) -> None:
    """Model weights and optimizer state of two full states agree (exactly, or within float tolerance)."""
    def close(a, b, what):
        # float32 sums in another order (all-reduce vs reduce-scatter, 1 vs 4 partial means), through Adam
        # (Adam's moments: relative to the tensor's own scale, since exp_avg_sq is ~grad**2)
        if exact:
            rtol, atol = 0, 0
        elif what.startswith("model"):
            rtol, atol = 1e-4, 1e-5
        else:
            rtol, atol = 1e-3, 1e-3 * float(b.abs().max())
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")

    assert got["model"].keys() == ref["model"].keys()
    for name, value in ref["model"].items():
        close(got["model"][name], value, f"model {name}")
    assert got["optimizer"]["state"].keys() == ref["optimizer"]["state"].keys()
    for index, moments in ref["optimizer"]["state"].items():
        assert got["optimizer"]["state"][index].keys() == moments.keys()
        for name, value in moments.items():
            close(got["optimizer"]["state"][index][name], value, f"optimizer state {index}.{name}")
    assert [g["params"] for g in got["optimizer"]["param_groups"]] == [g["params"] for g in ref["optimizer"]["param_groups"]]


# ------------------------------------------------------------------------------ equivalence and memory


@pytest.mark.parametrize("shape", ["1x2", "1x4"])
@pytest.mark.parametrize("mode", SHARDED)
def test_sharded_training_equals_ddp_and_shards_the_optimizer_state(train, mode, shape):
    """At 1x2 the optimizer is AdamW in two parameter groups, made by ``make_optimizer`` (the same runs as
    test_parameter_groups_from_make_optimizer_under_every_mode's); at 1x4, Adam from its class."""
    world, groups = SHAPES[shape], shape == "1x2"
    ref, got = train("none", shape, groups=groups), train(mode, shape, groups=groups)

    # the mode really ran (not a silent fallback to DDP), every rank took the same steps
    wrapper, optimizer = EXPECTED_TYPES[mode]
    for rec in got["records"].values():
        assert (rec["wrapped"], rec["optimizer"]) == (wrapper, "AdamW" if groups and optimizer == "Adam" else optimizer)
        assert rec["mode"] == mode
        assert rec["steps"] == STEPS and rec["world_size"] == world
    assert got["final"]["step"] == ref["final"]["step"] == STEPS

    # same seed and global batch: the same weights and Adam's moments as unsharded DDP
    assert_same_state(got["final"], ref["final"])
    assert all(int(s["step"]) == STEPS for s in got["final"]["optimizer"]["state"].values())

    # optimizer state per process, measured in both runs: ~1/world of the unsharded, and the shards add up
    unsharded = ref["records"][0]["optimizer_state_bytes"]
    assert {r["optimizer_state_bytes"] for r in ref["records"].values()} == {unsharded}
    assert unsharded == state_bytes(ref["final"]["optimizer"]["state"])  # what DDP holds = the full state
    per_rank = [got["records"][r]["optimizer_state_bytes"] for r in range(world)]
    for rank, b in enumerate(per_rank):
        ratio = b / (unsharded / world)
        assert 0.8 <= ratio <= 1.25, f"rank {rank} holds {b} bytes = {ratio:.2f} x unsharded/{world} ({per_rank})"
    steps_bytes = 4 * len(ref["final"]["optimizer"]["state"])  # Adam's float32 `step`, one per parameter
    if mode == "fsdp":
        # parameters are sharded too (dim 0, unpadded), and each rank keeps its own `step` scalars
        numel = sum(v.numel() for v in ref["final"]["model"].values())
        assert sum(r["local_param_numel"] for r in got["records"].values()) == numel
        assert max(r["local_param_numel"] for r in got["records"].values()) <= numel / world * 1.1
        assert sum(per_rank) == unsharded + (world - 1) * steps_bytes
    else:
        assert sum(per_rank) == unsharded  # disjoint shards: each parameter's state lives on one rank
        assert all(r["local_param_numel"] == got["records"][0]["local_param_numel"] for r in got["records"].values())


@pytest.mark.parametrize("mode", ["none", *SHARDED])
def test_parameter_groups_from_make_optimizer_under_every_mode(train, mode):
    """ctx.setup(model, make_optimizer=f): AdamW with weight decay on the matrices and none on the biases, built by
    every mode in its order; the groups reach each rank's share, and training equals unsharded DDP's with them."""
    ref, got = train("none", "1x2", groups=True), train(mode, "1x2", groups=True)
    for rec in got["records"].values():
        wrapper, optimizer = EXPECTED_TYPES[mode]
        assert (rec["wrapped"], rec["optimizer"]) == (wrapper, "AdamW" if optimizer == "Adam" else optimizer)
        assert rec["weight_decay"] == [0.1, 0.0]
        assert rec["local_weight_decay"] and set(rec["local_weight_decay"]) <= {0.1, 0.0}
    assert set().union(*(r["local_weight_decay"] for r in got["records"].values())) == {0.1, 0.0}
    groups = [(g["weight_decay"], len(g["params"])) for g in got["final"]["optimizer"]["param_groups"]]
    assert groups == [(0.1, 10), (0.0, 10)]  # 10 Linear layers: their weights, then their biases
    assert_same_state(got["final"], ref["final"])


# ------------------------------------------------------------------------------ checkpoints across modes


@builds_optimizers
@pytest.mark.parametrize("saver, resumer", [
    (("zero", "1x4"), ("none", "1x2")),
    (("none", "1x1"), ("fsdp", "1x2")),
    (("sdp", "1x4"), ("oss", "1x2")),
], ids=["zero1x4-to-none1x2", "none1x1-to-fsdp1x2", "sdp1x4-to-oss1x2"])  # the savers at 1x4: the equivalence runs
def test_consolidated_checkpoint_resumes_under_another_mode_and_world_size(train, saver, resumer):
    saved = train(*saver)
    checkpoint = torch.load(saved["checkpoint"])
    assert checkpoint["step"] == STEPS
    assert_same_state(checkpoint, saved["final"], exact=True)  # the checkpoint is the consolidated state
    # it is plain torch: an unsharded model and Adam load it as they are
    from workloads.sharded import build

    plain = build(48, 8)
    plain.load_state_dict(checkpoint["model"])
    torch.optim.Adam(plain.parameters(), lr=0.01).load_state_dict(checkpoint["optimizer"])

    resumed = train(*resumer, steps=4, resume=saved["checkpoint"])
    # right after loading, the resumer holds exactly the saved state (re-consolidated from its shards)
    assert resumed["loaded"]["step"] == STEPS
    assert_same_state(resumed["loaded"], checkpoint, exact=True)
    # and it continues: the step count and Adam's own step go on from there
    assert {r["steps"] for r in resumed["records"].values()} == {STEPS + 4}
    assert all(int(s["step"]) == STEPS + 4 for s in resumed["final"]["optimizer"]["state"].values())
    # as if it had never stopped: 16 steps of the unsharded run (the same data order and seed)
    assert_same_state(resumed["final"], train("none", "1x2", steps=STEPS + 4)["final"])


def test_digits_recipe_checkpoints_and_resumes_sharded(tmp_path):
    first = tmp_path / "first"
    first.mkdir()
    done = run("sharding=fsdp", "recipe.epochs=10", cwd=first, timeout=300)  # evaluates on every rank
    assert done.code == 0, done.output
    checkpoint = run_folder(first) / "checkpoints" / "last.pt"
    assert torch.load(checkpoint)["epoch"] == 10
    second = tmp_path / "second"
    second.mkdir()
    done = run("topology=1x4", "sharding=zero", f"recipe.resume={checkpoint}", cwd=second, timeout=300)
    assert done.code == 0, done.output
    assert "resumed from" in done.stdout and "step 210, epoch 10" in done.stdout
    acc = float(done.stdout.split("final test accuracy: ")[1].split()[0])
    assert acc >= 0.95
    rows = [json.loads(line) for line in (run_folder(second) / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["final"] is True and rows[-1]["steps"] == 420  # 210 before, 210 after


# ------------------------------------------------------------------------------ the context, no processes


def context(tmp_path: Path, mode: str, world: int = 1, parallel: ParallelMode = ParallelMode.ddp) -> RunContext:
    place = RankPlace(global_rank=0, local_rank=0, node_rank=0, world_size=world, local_world_size=world, host="here",
                      device="cpu", device_ids=())
    return RunContext(ContextSettings(place=place,
                                      parallel=ParallelConfig(mode=parallel), sharding=ShardingConfig(mode=ShardingMode(mode)),
                                      global_batch_size=8, seed=0, output_dir=tmp_path,
                                      metrics_file=tmp_path / "metrics.jsonl", checkpoint_dir=tmp_path / "checkpoints"))


@pytest.mark.parametrize("mode", SHARDED)
def test_wrap_refuses_to_shard_and_points_to_setup(tmp_path, mode):
    with pytest.raises(ValueError, match=r"ctx\.setup\(model, torch\.optim\.Adam"):
        context(tmp_path, mode, world=2).wrap(nn.Linear(2, 2))


@builds_optimizers
@pytest.mark.parametrize("mode", ["none", *SHARDED])
def test_world_size_1_is_plain_training_with_a_notice(tmp_path, mode, capsys):
    ctx = context(tmp_path, mode)
    model, optimizer = ctx.setup(nn.Linear(4, 3), torch.optim.Adam, lr=0.1)
    assert type(model) is nn.Linear and type(optimizer) is torch.optim.Adam
    assert optimizer.defaults["lr"] == 0.1
    assert ("shards nothing" in capsys.readouterr().out) is (mode != "none")
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    assert ctx.optimizer_state_bytes(optimizer) == (3 * 4 + 3) * 4 * 2 + 2 * 4  # exp_avg, exp_avg_sq, step
    full = ctx.full_state(model, optimizer)
    assert full["model"]["weight"].data_ptr() != model.weight.data_ptr()  # a snapshot, not the live tensor
    before = model.weight.detach().clone()
    optimizer.step()
    ctx.load_full_state(model, optimizer, full)
    torch.testing.assert_close(model.weight.detach(), before, rtol=0, atol=0)
    # the checkpoint helpers take the model and optimizer too
    ctx.save_checkpoint({"step": 3}, model=model, optimizer=optimizer)
    assert ctx.load_checkpoint(model=model, optimizer=optimizer) == {"step": 3}


@builds_optimizers
def test_dp_with_sharding_runs_plain(tmp_path):
    # validation refuses it; should a context still get there, it trains unsharded rather than failing later
    model, optimizer = context(tmp_path, "zero", parallel=ParallelMode.dp).setup(nn.Linear(2, 2), torch.optim.SGD, lr=1)
    assert type(model) is nn.Linear and type(optimizer) is torch.optim.SGD


def test_fsdp_units_leave_tied_weights_to_the_root():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(10, 4)
            self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)])
            self.norm = nn.LayerNorm(4)
            self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight

    model = Tied()
    units = default_shard_units(model)
    assert units == [model.blocks[0], model.blocks[2], model.norm]


def test_optimizer_state_by_name_and_by_index_round_trip():
    # Adam's state_dict after a step, written out (a real optimizer's first step imports torch._dynamo: 0.6 s of
    # `pytest -m unit`; the functions read the dict's form only)
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))
    osd = {"state": {i: {"step": torch.tensor(1.0), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
                     for i, p in enumerate(model.parameters())},
           "param_groups": [{"lr": 0.001, "betas": (0.9, 0.999), "params": [0, 1, 2, 3]}]}
    names = [n for n, _ in model.named_parameters()]
    by_name = _by_name(osd, names)
    assert list(by_name["state"]) == names and by_name["param_groups"][0]["params"] == names
    back = _by_index(by_name, names)
    assert back["param_groups"] == osd["param_groups"] and back["state"].keys() == osd["state"].keys()
    with pytest.raises(ValueError, match="4 parameters, this one has 3"):
        _by_name(osd, names[:3])


def test_state_bytes_counts_a_storage_once():
    t = torch.zeros(10)
    assert state_bytes({0: {"a": t, "b": t}, 1: {"c": torch.zeros(2, dtype=torch.float64)}, 2: None}) == 40 + 16
