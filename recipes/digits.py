"""Handwritten digits (scikit-learn's bundled 8x8 images: real data, no download) with a small MLP.

The default job: ``run`` trains this on 1 host x 2 CPU processes and prints the test accuracy.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.utils.data import TensorDataset

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from runner.api import RunContext


def load_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """The 1797 images (64 pixels each, 0-16) and their labels, from the data file scikit-learn ships, read
    without importing scikit-learn (about 1.5 s of CPU in every rank); through scikit-learn where its layout
    differs. Raises ModuleNotFoundError without scikit-learn."""
    import gzip
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("sklearn")  # finds the package, imports nothing
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("No module named 'sklearn'", name="sklearn")
    data = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
    if not data.is_file():
        from sklearn.datasets import load_digits as from_sklearn

        x, y = from_sklearn(return_X_y=True)
        return torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.long)
    with gzip.open(data, "rt") as f:
        table = torch.tensor([[float(v) for v in line.split(",")] for line in f if line.strip()], dtype=torch.float64)
    return table[:, :-1], table[:, -1].long()


def stratified_split(y: torch.Tensor, test_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Train and test indices: ``ceil(test_fraction * n)`` for test, each class in proportion (the largest
    remainders take the rounding), shuffled by ``seed``; the same on every rank."""
    generator = torch.Generator().manual_seed(seed)
    classes, counts = torch.unique(y, return_counts=True)
    n_test = math.ceil(test_fraction * len(y))
    exact = counts.double() * n_test / len(y)
    share = exact.floor().long()
    for i in torch.argsort(exact - share, descending=True, stable=True)[: n_test - int(share.sum())]:
        share[i] += 1
    train, test = [], []
    for label, k in zip(classes.tolist(), share.tolist()):
        members = torch.nonzero(y == label).flatten()
        members = members[torch.randperm(len(members), generator=generator)]
        test.append(members[:k])
        train.append(members[k:])
    order = lambda parts: torch.cat(parts)[torch.randperm(sum(len(p) for p in parts), generator=generator)]  # noqa: E731
    return order(train), order(test)


def datasets(test_fraction: float, seed: int) -> tuple[TensorDataset, TensorDataset]:
    x, y = load_digits()
    train_i, test_i = stratified_split(y, test_fraction, seed)
    x_train, x_test = x[train_i], x[test_i]
    mean, std = x_train.mean(0), x_train.std(0, unbiased=False) + 1e-6  # statistics of the training split only
    as_x = lambda a: ((a - mean) / std).float()  # noqa: E731
    return TensorDataset(as_x(x_train), y[train_i]), TensorDataset(as_x(x_test), y[test_i])


def build_model(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))


@torch.no_grad()
def accuracy(model: nn.Module, data: TensorDataset, device: torch.device) -> float:
    """Test accuracy. Call it on every rank: a sharded (FSDP) model gathers its parameters to run."""
    x, y = data.tensors
    model.eval()
    pred = model(x.to(device)).argmax(1)
    model.train()
    return (pred == y.to(device)).float().mean().item()


def main(ctx: RunContext, cfg: DictConfig) -> dict[str, float]:
    train, test = datasets(cfg.test_fraction, cfg.seed)
    # wrapped and sharded as the spec says (sharding=none/oss/sdp/zero/fsdp): the recipe does not change
    model, optimizer = ctx.setup(build_model(cfg.hidden), torch.optim.Adam, lr=cfg.lr)
    loader = ctx.loader(train)
    loss_fn = nn.CrossEntropyLoss()
    step, first_epoch, skip = 0, 0, 0
    # this run's own last checkpoint (a restarted or requeued attempt, a relaunch with the same run id) wins over
    # recipe.resume; every rank takes rank 0's decision, whatever its own host's folder holds
    source = ctx.checkpoint_to_resume(fallback=cfg.get("resume"))
    if source is not None:
        # a full checkpoint of any sharding mode and world size; the global batch order is the seed's,
        # so continuing at the saved batch takes the steps an uninterrupted run would take
        saved = ctx.load_checkpoint(path=source, model=model, optimizer=optimizer)
        step, first_epoch, skip = saved["step"], saved["epoch"], saved.get("batch", 0)
        if ctx.is_main:
            print(f"resumed from {source}: step {step}, epoch {first_epoch}, batch {skip}", flush=True)
    if ctx.is_main:
        split = ctx.batch_split  # 64 over 3 processes: 22, 21, 21 (shown as 22/21)
        shares = "/".join(str(n) for n in sorted(set(split.counts), reverse=True))
        micro = f", micro-batches of at most {split.micro_size}" if split.micro_size is not None else ""
        print(f"digits: {len(train)} train / {len(test)} test images, {ctx.world_size} process(es), "
              f"global batch {cfg.global_batch_size} ({shares} per process{micro}), {cfg.epochs} epochs, "
              f"sharding={ctx.sharding_mode}", flush=True)
    samples, t0 = 0, time.perf_counter()
    # a live bar on rank 0's terminal (plain lines where it is not a TTY, and in every rank's log);
    # a resumed run starts at its step
    bar = ctx.progress(cfg.epochs * len(loader), "train", initial=step)
    for epoch in range(first_epoch, cfg.epochs):
        loader.sampler.set_epoch(epoch)
        total = 0.0
        for batch, (x, y) in enumerate(loader):
            if batch < skip:
                continue  # trained before the stop this run resumed from
            optimizer.zero_grad(set_to_none=True)
            # this process's share of the global batch, in micro-batches of at most recipe.micro_batch_size; each
            # loss weighted so that the step's gradient is the global batch's mean at any world size
            last = 0.0
            for (xm, ym), weight, share in ctx.micro_batches((x, y), model):
                loss = loss_fn(model(xm), ym)
                (loss * weight).backward()
                last += loss.item() * share  # this process's mean loss, as shown
            optimizer.step()
            total += last
            step += 1
            samples += cfg.global_batch_size
            bar.update(loss=last, samples=cfg.global_batch_size)
            if ctx.should_stop(every=cfg.stop_check_every):  # Slurm's time-limit signal, or a stop request
                ctx.save_checkpoint({"step": step, "epoch": epoch, "batch": batch + 1}, model=model, optimizer=optimizer)
                if ctx.is_main:
                    print(f"stop requested: checkpoint at step {step} (epoch {epoch}, batch {batch + 1}) "
                          f"in {ctx.checkpoint_dir}", flush=True)
                bar.close()
                return {"stopped": True, "steps": step}
        skip = 0
        elapsed = time.perf_counter() - t0
        if epoch % 5 == 4 or epoch == cfg.epochs - 1:
            acc = accuracy(ctx.unwrap(model), test, ctx.device)  # every rank: FSDP's forward is collective
            ctx.log(step, epoch=epoch + 1, loss=total / len(loader), samples_per_s=samples / elapsed,
                    test_accuracy=acc)
            # consolidated (full) state: resumable under any sharding mode and world size
            ctx.save_checkpoint({"step": step, "epoch": epoch + 1}, model=model, optimizer=optimizer)
    bar.close()
    result = {"test_accuracy": accuracy(ctx.unwrap(model), test, ctx.device), "steps": step,
              "optimizer_state_bytes": ctx.optimizer_state_bytes(optimizer)}
    if ctx.is_main:
        ctx.log(step, final=True, **result, echo=False)
        print(f"final test accuracy: {result['test_accuracy']:.4f} after {step} steps", flush=True)
    return result
