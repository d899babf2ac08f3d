"""What a recipe sees: its place in the job, the device, and the runner's services.

A recipe receives a :class:`RunContext` and its own config (``runner.api`` is what recipes import), and never
imports launcher internals. The worker builds the context from :class:`ContextSettings`; recipes do not.
Wrapping, sharding and full (consolidated) checkpoints are delegated to the strategy of
``sharding.mode`` (:mod:`runner.training.sharding`).
"""

from __future__ import annotations

import contextlib
import socket
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer
from torch.utils.data import DataLoader, Dataset

from runner.common.signals import StopRequest
from runner.records.paths import RunPaths
from runner.spec.place import RankPlace
from runner.spec.schema import ParallelConfig, ShardingConfig, ShardingMode
from runner.spec.batch import BatchSplit
from runner.training.batches import MicroBatch, global_batch_loader, micro_batches
from runner.training.checkpointing import Checkpointing
from runner.training.collectives import Collectives
from runner.training.copies import Copies
from runner.training.metrics_log import MetricsLog
from runner.training.output import AgentChannel
from runner.training.progress import LINE_INTERVAL_S, Progress, StepCount, for_rank
from runner.training.sharding import OptimizerFactory, OptimizerRecipe, Placement, Strategy, strategy_for


@dataclass(frozen=True, kw_only=True)
class ContextSettings:
    """Everything a run context is built from (by the worker, runner.worker.rank; not by recipes)."""

    place: RankPlace  # where this process is: its ranks, host, device and the GPUs it drives (the plan's)
    parallel: ParallelConfig
    sharding: ShardingConfig
    global_batch_size: int | None
    seed: int
    output_dir: Path  # the run's folder
    metrics_file: Path  # where ctx.log appends (rank 0)
    checkpoint_dir: Path  # where ctx.save_checkpoint writes
    attempt: int = 0  # restarts so far
    keep_on_every_host: bool = False  # checkpoints kept on every host, not only rank 0's (a job that outlives hosts)
    micro_batch_size: int | None = None  # the most samples a process takes at once (None: its whole share)
    # this process's own services, which a rank makes once (runner.worker.rank) and which outlive the context:
    stop: StopRequest = field(default_factory=StopRequest)  # set by the stop signal (ctx.stop_requested); never, here
    steps: StepCount = field(default_factory=StepCount)  # its progress bars' steps, read by the rank's watch
    agent: AgentChannel | None = None  # the rank's channel to its host agent; None: progress goes to stdout


class RunContext:
    """Rank, device, wrapping, data, progress, metrics and checkpoints for one process of a job.

    Where this process is (:attr:`rank`, :attr:`local_rank`, :attr:`world_size`, :attr:`is_main`,
    :attr:`device`); the model wrapped or sharded as the spec says (:meth:`setup`, :meth:`wrap`,
    :meth:`unwrap`, :meth:`full_state`); this process's share of each global batch (:meth:`loader`) in
    micro-batches with their loss weights (:meth:`micro_batches`); progress of a loop (:meth:`progress`: a live
    bar on rank 0's terminal, plain lines in the logs); metrics (:meth:`log`, rank 0 to metrics.jsonl);
    checkpoints (:meth:`save_checkpoint`, :meth:`load_checkpoint`); stop requests (:meth:`should_stop`); small
    collectives (:meth:`mean`, :meth:`barrier`). What they do is the work of runner.training's sharding,
    checkpointing, metrics_log, collectives and batches: this class is what a recipe calls."""

    def __init__(self, settings: ContextSettings) -> None:
        self._settings = settings
        self._device = torch.device(settings.place.device)
        self._stop_calls = 0
        self._collectives = Collectives(self._device, settings.place.world_size)
        self._metrics = MetricsLog(settings.metrics_file)
        self._progress: list[Progress] = []
        self._checkpoints = Checkpointing(settings.checkpoint_dir,
                                          Copies(settings.place, self._device, settings.keep_on_every_host),
                                          is_main=settings.place.is_main, agent=settings.agent,
                                          sharding=lambda: self._sharding, barrier=self.barrier)

    # -- where am I -------------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        """This process's global rank, 0 .. world_size - 1."""
        return self._settings.place.global_rank

    @property
    def local_rank(self) -> int:
        """This process's rank on its host."""
        return self._settings.place.local_rank

    @property
    def node_rank(self) -> int:
        """Its host's index in the topology."""
        return self._settings.place.node_rank

    @property
    def world_size(self) -> int:
        """Processes in the job."""
        return self._settings.place.world_size

    @property
    def local_world_size(self) -> int:
        """Processes on this host."""
        return self._settings.place.local_world_size

    @property
    def host(self) -> str:
        """Its host, as the plan names it."""
        return self._settings.place.host

    @property
    def is_main(self) -> bool:
        """Global rank 0: the process that logs metrics and writes checkpoints."""
        return self._settings.place.is_main

    @property
    def device(self) -> torch.device:
        """This process's device: ``cuda:i`` (its local GPU) or ``cpu``."""
        return self._device

    @property
    def seed(self) -> int:
        """The recipe's seed (``recipe.seed``): torch is seeded with it before the recipe is called."""
        return self._settings.seed

    @property
    def attempt(self) -> int:
        """Restarts so far: 0, then 1, 2, ... when the job was restarted or requeued."""
        return self._settings.attempt

    @property
    def output_dir(self) -> Path:
        """The run's folder (metrics.jsonl, checkpoints/, logs/ ...)."""
        return self._settings.output_dir

    @property
    def global_batch_size(self) -> int | None:
        """``recipe.global_batch_size``: the samples of one step over all processes, whatever the world size."""
        return self._settings.global_batch_size

    @property
    def sharding_mode(self) -> str:
        """``none``, ``oss``, ``sdp``, ``zero`` or ``fsdp``: what :meth:`setup` does with the model and optimizer."""
        return self._settings.sharding.mode.value

    @property
    def batch_split(self) -> BatchSplit:
        """How the global batch is split over the processes and, in each, over micro-batches
        (:class:`runner.spec.batch.BatchSplit`)."""
        if self.global_batch_size is None:
            raise ValueError("recipe.global_batch_size is not set: the recipe's config must give one")
        return BatchSplit(self.global_batch_size, self.world_size, self._settings.micro_batch_size)

    @property
    def per_process_batch_size(self) -> int:
        """This process's share of each global batch: global // world size, one more on the first global % world size
        ranks (64 over 3: 22, 21, 21); DP keeps the global batch in its one process."""
        return self.batch_split.count(self.rank)

    @property
    def micro_batch_size(self) -> int | None:
        """``recipe.micro_batch_size``: the most samples this process puts through the model at once (None: its
        whole share); :meth:`micro_batches` cuts each batch so."""
        return self._settings.micro_batch_size

    # -- model ---------------------------------------------------------------------------------------
    @cached_property
    def _sharding(self) -> Strategy:
        """The strategy of ``sharding.mode`` (runner.training.sharding), made when first needed; DDP/DP for none."""
        return strategy_for(Placement.of(self._settings.place, self._settings.parallel, self._settings.sharding))

    def setup(self, model: nn.Module, optimizer_class: OptimizerFactory | None = None, /, *,
              make_optimizer: Callable[[nn.Module], Optimizer] | None = None,
              shard_units: Iterable[nn.Module] | None = None, **optimizer_kwargs: Any) -> tuple[nn.Module, Optimizer]:
        """The model on this device, wrapped or sharded as the spec says, and its optimizer.

        The optimizer is built by the strategy of ``sharding.mode``, in the order it needs (fairscale's OSS
        before ShardedDDP, torch's optimizer after FSDP2's ``fully_shard``); the same call works for every
        mode, DDP, DP and world size 1. Either

        * ``optimizer_class`` and its keyword arguments: ``optimizer_class(model.parameters(), **optimizer_kwargs)``
          (``ctx.setup(model, torch.optim.Adam, lr=1e-3)``), or
        * ``make_optimizer``: a function of the model that returns its optimizer, for parameter groups
          (``make_optimizer=lambda m: torch.optim.AdamW(groups(m), lr=1e-3)``). It is called with the model as
          the mode has it when the optimizer is made: wrapped in DDP (none, oss, zero), sharded (fsdp), or the
          plain module on its device (sdp, whose wrapper takes the optimizer); pick groups by module type or
          ``p.ndim``, not by names, which the wrappers change. Under oss, sdp and zero the optimizer it returns
          gives the class, the groups and the defaults of the sharded one, which holds this process's share.

        ``shard_units`` (fsdp only): the submodules that become FSDP units (default: the model's
        children that hold parameters, and the blocks of its ModuleLists)."""
        how = OptimizerRecipe.asked(optimizer_class, make_optimizer, optimizer_kwargs)
        return self._sharding.setup(model, how, shard_units)

    def wrap(self, model: nn.Module) -> nn.Module:
        """Move the model to this process's device and wrap it as the spec says (DDP or DP); sharding=none only."""
        if self._settings.sharding.mode is not ShardingMode.none:
            raise ValueError(f"ctx.wrap(model) cannot shard: sharding={self.sharding_mode} builds the optimizer "
                             f"together with the model. Use `model, optimizer = ctx.setup(model, torch.optim.Adam, "
                             f"lr=...)` instead of ctx.wrap and your own optimizer (it works for every sharding mode)")
        return self._sharding.wrap(model)

    @staticmethod
    def unwrap(model: nn.Module) -> nn.Module:
        """The module inside a DDP/DP/ShardedDDP wrapper; an FSDP2 model is its own (sharded) module.

        For a checkpoint use :meth:`full_state` (parameters of a sharded model are shards). Calling an
        FSDP model is collective: evaluate it on every rank."""
        return Strategy.unwrap(model)

    def full_state(self, model: nn.Module, optimizer: Optimizer | None = None) -> dict[str, Any] | None:
        """The full (consolidated) state ``{"model": ..., "optimizer": ...}`` on the main process, CPU copies.

        Call it on every process (sharded modes gather over all ranks); the others get None. The
        format is the same in every mode: the plain module's ``state_dict()`` and the ``state_dict()``
        an unsharded optimizer would have, so it loads under any mode and world size, and in plain torch."""
        return self._sharding.full_state(model, optimizer)

    def load_full_state(self, model: nn.Module, optimizer: Optimizer | None, state: dict[str, Any]) -> None:
        """Load a full state (from :meth:`full_state` of any mode and world size) on every process.

        ``state`` keeps its entries; as with torch's ``load_state_dict``, its optimizer tensors may be
        shared with the optimizer afterwards (do not reuse them as a snapshot)."""
        self._sharding.load_full_state(model, optimizer, state)

    def optimizer_state_bytes(self, optimizer: Optimizer) -> int:
        """Bytes of optimizer state this process holds (its shard under oss/sdp/zero/fsdp)."""
        return self._sharding.optimizer_state_bytes(optimizer)

    # -- data ---------------------------------------------------------------------------------------
    def loader(self, dataset: Dataset, *, shuffle: bool = True, drop_last: bool = True, **kwargs: Any) -> DataLoader:
        """A loader of this process's share of each global batch.

        Global batch b is dataset[perm[b*G:(b+1)*G]] (perm seeded by seed + epoch) whatever the
        world size: rank r takes the indices at positions r, r + world_size, ... of it
        (:attr:`per_process_batch_size` of them), so the ranks' batches together form exactly that
        global batch (:class:`~runner.training.batches.GlobalBatchSampler`). Call
        ``loader.sampler.set_epoch(e)`` each epoch. Incomplete global batches are dropped
        (``drop_last``) so that every topology takes the same steps. Put each batch through
        :meth:`micro_batches`: the loss weights make the step's gradient the global batch's mean
        whether or not the split is even."""
        return global_batch_loader(dataset, self.batch_split, self.rank, shuffle=shuffle, seed=self.seed,
                                   drop_last=drop_last, **kwargs)

    def micro_batches(self, batch: Any, model: nn.Module) -> Iterator[MicroBatch]:
        """This process's batch (as :meth:`loader` gives it) in micro-batches of at most ``recipe.micro_batch_size``
        samples, on this process's device, each with the weight of its mean loss:

        .. code-block:: python

            for batch in loader:
                optimizer.zero_grad()
                for (x, y), weight, _ in ctx.micro_batches(batch, model):
                    (loss_fn(model(x), y) * weight).backward()
                optimizer.step()

        ``weight`` is the micro-batch's samples x world size / global batch, so that the gradients DDP averages
        over the processes are the mean over the global batch, whether or not it divides over them (1.0 for a
        whole share of an even split). Every process runs the same number of micro-batches (one without
        ``recipe.micro_batch_size``); the backward passes of all but the last accumulate without exchanging gradients
        (``no_sync`` and its kin), so ``model`` is the one :meth:`setup` or :meth:`wrap` returned.
        Each item is a :class:`~runner.training.batches.MicroBatch` ``(data, weight, share)``: ``data`` in the
        batch's structure (tensors cut on their first dimension), ``share`` its part of this process's batch."""
        return micro_batches(batch, self.batch_split, lambda: self._sharding.no_sync(model), self.device)

    # -- collectives --------------------------------------------------------------------------------
    def mean(self, value: float | torch.Tensor) -> float:
        """The mean of a scalar over all processes."""
        return self._collectives.mean(value)

    def barrier(self) -> None:
        """Wait for every process (nothing to wait for at world size 1)."""
        self._collectives.barrier()

    # -- stopping early -------------------------------------------------------------------------------
    @property
    def stop_requested(self) -> bool:
        """This process was asked to stop (Slurm's --signal before the time limit or at preemption,
        forwarded by the runner): checkpoint and return. Local to this process; see :meth:`should_stop`."""
        return self._settings.stop.requested

    def should_stop(self, every: int = 1) -> bool:
        """Whether any process was asked to stop, agreed over all processes: call it at the same point
        on every rank, e.g. once per step, then checkpoint and return together. The agreement is a small
        all-reduce, done on every ``every``-th call only (the others say False)."""
        self._stop_calls += 1
        if self._stop_calls % max(1, every):
            return False
        return self._collectives.any_of(self._settings.stop.requested)

    # -- progress -----------------------------------------------------------------------------------
    def progress(self, total: int | None, desc: str = "", *, initial: int = 0,
                 interval_s: float = LINE_INTERVAL_S) -> Progress:
        """Show a loop's progress: call ``bar.update(loss=..., samples=...)`` once per step, then ``bar.close()`` (or
        use ``with``; the context closes what is left open when the recipe returns). Rank 0 draws a live bar on its
        terminal when that is a TTY; plain lines go to every rank's log, at every tenth of ``total`` and at least every
        ``interval_s``. ``initial``: steps taken before (a resumed run). No collectives: pass the global batch as
        ``samples`` for the job's throughput (where it shows, and what: :mod:`runner.training.progress`)."""
        settings = self._settings
        bar = for_rank(settings.agent, settings.steps, total, desc, initial=initial, interval_s=interval_s)
        self._progress.append(bar)
        return bar

    # -- metrics ------------------------------------------------------------------------------------
    def log(self, step: int, *, echo: bool = True, **metrics: float) -> None:
        """Record metrics of the main process as one JSON line in metrics.jsonl (others: no-op)."""
        if self.is_main:
            self._metrics.write(step, metrics, echo)

    # -- checkpoints --------------------------------------------------------------------------------
    @property
    def checkpoint_dir(self) -> Path:
        """Where :meth:`save_checkpoint` writes (the run folder's checkpoints/)."""
        return self._settings.checkpoint_dir

    def save_checkpoint(self, state: dict[str, Any] | None = None, name: str = "last", *,
                        model: nn.Module | None = None, optimizer: Optimizer | None = None) -> Path:
        """The main process writes ``state`` atomically to checkpoints/<name>.pt; every process waits for it. With
        ``model`` (and ``optimizer``), call it on every process: their full state (:meth:`full_state`) is gathered and
        saved under ``"model"`` and ``"optimizer"`` beside ``state``'s own entries. Each save is recorded beside the
        file (``<name>.pt.commit``), and in a job that outlives its hosts every host keeps a copy
        (runner.training.copies)."""
        return self._checkpoints.save(state, name, model, optimizer)

    def checkpoint_to_resume(self, fallback: str | Path | None = None, name: str = "last") -> Path | None:
        """The checkpoint this run resumes from, the same on every process: the run's own (``checkpoints/<name>.pt``:
        a restart, a requeue, a relaunch with the same run id), its newest copy on any host (hosts with run folders
        of their own may hold copies of different ages: the newest wins, and the host that holds it sends it when
        :meth:`load_checkpoint` loads it), else ``fallback`` (another run's, as ``recipe.resume`` names it) where the
        main process has it, else None. Call it on every process, then :meth:`load_checkpoint` with the path it
        gives: every rank takes the same branch, whatever its host's own folder holds. Raises FileNotFoundError (on
        every process) when ``fallback`` is given and the main process has no such file."""
        return self._checkpoints.to_resume(fallback, name)

    def load_checkpoint(self, name: str = "last", path: str | Path | None = None, *, model: nn.Module | None = None,
                        optimizer: Optimizer | None = None) -> dict[str, Any] | None:
        """A saved state, mapped onto this process's device; None when there is none. Call it on every process:
        they all get the same checkpoint (the run's own: its newest copy on any host; another file: the main
        process's), read from the file where they see the same one, else sent by the process that has it. With
        ``model`` (and ``optimizer``), the checkpoint's full state is loaded into them (:meth:`load_full_state`,
        whatever mode and world size saved it) and the other entries are returned. Only plain checkpoints load
        (tensors, dicts, lists, tuples, numbers, strings: what :meth:`save_checkpoint` writes): a file that names other
        types, whose loading could run code, raises :class:`~runner.training.checkpoints.CheckpointError` without
        running any of it."""
        return self._checkpoints.load(name, path, model, optimizer)

    def _close(self) -> None:
        """What is left open when the recipe returns (progress bars, the metrics file); the worker calls it."""
        for bar in self._progress:
            bar.close()
        self._metrics.close()
        sys.stdout.flush()


@contextmanager
def single_process_context(cfg: Mapping[str, Any] | None = None, output_dir: str | Path | None = None, *,
                           device: str = "cpu", process_group: bool = False) -> Iterator[RunContext]:
    """A run context for one process, to call a recipe directly: in a unit test, a notebook, a debugger.

    ``with single_process_context(cfg, tmp_path) as ctx: result = main(ctx, cfg)`` gives the recipe what
    ``run topology=1x1`` gives its one rank: rank 0 of a world of 1 on ``device``, ``cfg``'s ``global_batch_size``,
    ``micro_batch_size`` and ``seed`` (torch is seeded with it, as the worker does), and ``output_dir`` as its run
    folder (metrics.jsonl, checkpoints/; a temporary folder, removed afterwards, when None). Sharding and DDP have
    nothing to do at world size 1: ``ctx.setup`` returns the model on the device and a plain optimizer. No process
    group is needed; with ``process_group=True`` a real one-rank gloo group is made (rendezvous by a file in the
    folder: no port), for a recipe that calls ``torch.distributed`` itself, and destroyed on leaving (one that exists
    already is used)."""
    cfg = cfg if cfg is not None else {}
    with contextlib.ExitStack() as stack:
        root = Path(output_dir) if output_dir is not None else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="runner-context-")))
        root.mkdir(parents=True, exist_ok=True)
        paths = RunPaths(root, root.name)  # named as a run's folder is
        if process_group and not dist.is_initialized():
            rendezvous = tempfile.mkdtemp(prefix=".rendezvous-", dir=root)
            dist.init_process_group("gloo", init_method=f"file://{rendezvous}/store", rank=0, world_size=1)
            stack.callback(dist.destroy_process_group)
        elif process_group and dist.get_world_size() != 1:
            raise ValueError(f"single_process_context: a process group of {dist.get_world_size()} processes exists "
                             f"already; this context is a world of 1")
        seed = int(cfg.get("seed", 0))
        torch.manual_seed(seed)
        batch, micro = cfg.get("global_batch_size"), cfg.get("micro_batch_size")
        where = torch.device(device)
        place = RankPlace(global_rank=0, local_rank=0, node_rank=0, world_size=1, local_world_size=1,
                          host=socket.gethostname(), device=str(where),  # as given ("cuda": torch's current GPU)
                          device_ids=(where.index or 0,) if where.type == "cuda" else ())
        ctx = RunContext(ContextSettings(
            place=place, parallel=ParallelConfig(), sharding=ShardingConfig(),
            global_batch_size=int(batch) if batch is not None else None, seed=seed,
            micro_batch_size=int(micro) if micro is not None else None,
            output_dir=root, metrics_file=paths.metrics, checkpoint_dir=paths.checkpoints))
        stack.callback(ctx._close)
        yield ctx
