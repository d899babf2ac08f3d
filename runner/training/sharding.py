"""Sharded training, one small strategy per ``sharding.mode``, behind the run context.

A recipe calls ``model, optimizer = ctx.setup(model, torch.optim.Adam, lr=1e-3)`` (or, for parameter groups,
``ctx.setup(model, make_optimizer=f)`` with ``f(model) -> optimizer``) and never learns which strategy ran it.
Each strategy knows four things:

* how to wrap the model and build the optimizer, in the order its library needs (fairscale's
  ShardedDataParallel needs the OSS optimizer at construction; FSDP2 needs the optimizer built
  after ``fully_shard``, over the sharded parameters);
* how to export the *full* (consolidated) state of model and optimizer on rank 0;
* how to load such a full state, whatever mode and world size wrote it;
* how many bytes of optimizer state this process holds.

The full state is the same for every mode: ``{"model": <the plain module's state_dict()>,
"optimizer": <the state_dict() the unsharded optimizer would have>}`` (``optimizer_class(model.parameters())``, or
what ``make_optimizer(model)`` builds), tensors on the CPU. Parameters are numbered as torch numbers them (in the
order of the optimizer's parameter groups), so a checkpoint of any mode loads into any other mode, at any world
size, and into plain torch.

==========  ================================================  ===========================  =========
mode        what is sharded (per process ~ 1/world size)       gradients exchanged by       library
==========  ================================================  ===========================  =========
none        nothing                                            DDP all-reduce               torch
oss         optimizer state                                    DDP all-reduce               fairscale
sdp         optimizer state and gradients                      reduce to the owner          fairscale
zero        optimizer state                                    DDP all-reduce               torch
fsdp        parameters, gradients and optimizer state          reduce-scatter/all-gather    torch
==========  ================================================  ===========================  =========

World size 1 or ``parallel=dp``: every mode runs as ``none`` (there is nothing to shard across;
validation says so). fairscale (the extra ``torch-jobspec[fairscale]``) is imported only by the strategies that
use it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from runner.common.extras import FAIRSCALE, require
from runner.spec.place import RankPlace
from runner.spec.schema import ParallelConfig, ParallelMode, ShardingConfig, ShardingMode

OptimizerFactory = Callable[..., Optimizer]  # optimizer_class(params, **kwargs): a class or any factory


def _constructor_kwargs(cls: type, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of an optimizer's ``defaults`` that its constructor takes (torch's AdamW records
    ``decoupled_weight_decay``, which only Adam's constructor accepts)."""
    params = inspect.signature(cls).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(defaults)
    return {k: v for k, v in defaults.items() if k in params and k != "params"}


@dataclass(frozen=True)
class OptimizerRecipe:
    """How a recipe asked for its optimizer (``ctx.setup``): a class, or any factory of ``(params, **kwargs)``, with
    its keyword arguments; or ``make``, a function of the model that returns the optimizer (parameter groups)."""

    cls: OptimizerFactory | None = None
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    make: Callable[[nn.Module], Optimizer] | None = None

    @classmethod
    def asked(cls, optimizer_class: OptimizerFactory | None, make_optimizer: Callable[[nn.Module], Optimizer] | None,
              optimizer_kwargs: Mapping[str, Any]) -> OptimizerRecipe:
        """What ``ctx.setup(model, ...)`` was given, checked: an optimizer class and its arguments, or
        make_optimizer alone."""
        if (optimizer_class is None) == (make_optimizer is None):
            raise TypeError("ctx.setup(model, ...) takes an optimizer class (ctx.setup(model, torch.optim.Adam, "
                            "lr=1e-3)) or make_optimizer (ctx.setup(model, make_optimizer=lambda m: torch.optim.AdamW(...))), "
                            f"not {'both' if optimizer_class is not None else 'neither'}")
        if make_optimizer is not None and optimizer_kwargs:
            raise TypeError(f"ctx.setup(model, make_optimizer=...) takes no optimizer arguments (got "
                            f"{', '.join(sorted(optimizer_kwargs))}): give them to the optimizer make_optimizer builds")
        return cls(optimizer_class, optimizer_kwargs) if make_optimizer is None else cls(make=make_optimizer)

    def build(self, model: nn.Module) -> Optimizer:
        """The optimizer over ``model``'s parameters (as the strategy has them: wrapped, or sharded by FSDP2)."""
        if self.make is None:
            return self.cls(model.parameters(), **self.kwargs)
        made = self.make(model)
        if not isinstance(made, Optimizer):
            raise TypeError(f"make_optimizer returned {type(made).__name__}, not a torch.optim.Optimizer: it must "
                            f"build and return the optimizer, e.g. lambda m: torch.optim.AdamW(groups(m), lr=1e-3)")
        return made

    def parts(self, model: nn.Module) -> tuple[OptimizerFactory, Any, dict[str, Any]]:
        """What a sharding optimizer (fairscale's OSS, torch's ZeroRedundancyOptimizer) builds each process's own
        optimizer from: the class, the parameters or their groups, the keyword arguments. With ``make``: those of
        the optimizer it returns (its class, its groups with every option, the defaults its constructor takes);
        that optimizer holds no state yet, and is dropped."""
        if self.make is None:
            return self.cls, model.parameters(), dict(self.kwargs)
        made = self.build(model)
        return type(made), [dict(g) for g in made.param_groups], _constructor_kwargs(type(made), made.defaults)


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Where the strategy runs (this process: its ranks and device), and the spec's parallel and sharding settings."""

    place: RankPlace
    parallel: ParallelMode = ParallelMode.ddp
    sharding: ShardingConfig = field(default_factory=ShardingConfig)
    ddp_options: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, place: RankPlace, parallel: ParallelConfig, sharding: ShardingConfig) -> Placement:
        """The placement of a process at ``place``, with the spec's ``parallel`` and ``sharding`` (DDP's options from
        ``parallel``)."""
        return cls(place=place, parallel=parallel.mode, sharding=sharding,
                   ddp_options={"find_unused_parameters": parallel.find_unused_parameters,
                                "bucket_cap_mb": parallel.bucket_cap_mb})

    @property
    def device(self) -> torch.device:
        return torch.device(self.place.device)

    @property
    def distributed(self) -> bool:
        """Several processes that can shard across each other (DDP with world size > 1)."""
        return self.parallel is ParallelMode.ddp and self.place.world_size > 1 and dist.is_initialized()


# ---------------------------------------------------------------------------------------- helpers


def cpu_copy(obj: Any) -> Any:
    """``obj`` with every tensor copied to the CPU (detached; a snapshot that later steps do not change)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return type(obj)((k, cpu_copy(v)) for k, v in obj.items())  # dict or OrderedDict (state_dict's)
    if isinstance(obj, list):
        return [cpu_copy(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(cpu_copy(v) for v in obj)
    return obj


def _local(t: torch.Tensor) -> torch.Tensor:
    """This process's part of a tensor: the local shard of a DTensor, else the tensor."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def state_bytes(state: Mapping[Any, Any]) -> int:
    """Bytes of the tensors in an optimizer's ``state`` (param -> {name: value}) held by this process.

    DTensors count their local shard; a storage reached twice (aliases, views) counts once.
    """
    seen: set[tuple[str, int]] = set()
    total = 0
    for per_param in state.values():
        if not isinstance(per_param, Mapping):
            continue  # ZeRO keeps None for the parameters other ranks own
        for value in per_param.values():
            if not isinstance(value, torch.Tensor):
                continue
            t = _local(value)
            key = (str(t.device), t.data_ptr())
            if t.numel() and key in seen:
                continue
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


def _notice(placement: Placement, text: str) -> None:
    if placement.place.is_main:
        print(f"notice: {text}", flush=True)  # stdout: rank 0's reaches the terminal


def _param_names(model: nn.Module, optimizer: Optimizer) -> list[str]:
    """The name of each optimizer parameter, in the optimizer's order (index i of a torch state dict)."""
    names = {id(p): n for n, p in model.named_parameters(remove_duplicate=False)}
    out = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in names:
                raise ValueError("the optimizer holds a parameter that is not the model's: build it with ctx.setup")
            out.append(names[id(p)])
    return out


def _structure_copy(obj: Any) -> Any:
    """A copy of the dicts and lists of a state dict that shares its tensors.

    The loaders edit the dict they are given: fairscale's OSS and torch's ZeroRedundancyOptimizer
    blank the entries of the parameters other ranks own, torch.distributed.checkpoint's
    ``set_state_dict`` replaces tensors by DTensors. The caller's checkpoint must stay whole.
    """
    if isinstance(obj, dict):
        return type(obj)((k, _structure_copy(v)) for k, v in obj.items())
    if isinstance(obj, list):
        return [_structure_copy(v) for v in obj]
    return obj


# --------------------------------------------------------------------------------------- strategies


class Strategy:
    """``none``: the model wrapped as the spec says (DDP, or DP in one process), an ordinary optimizer."""

    mode = ShardingMode.none

    def __init__(self, placement: Placement) -> None:
        self.placement = placement

    # -- wrap and optimizer ---------------------------------------------------------------------
    def wrap(self, model: nn.Module) -> nn.Module:
        placement = self.placement
        device, device_ids = placement.device, placement.place.device_ids
        model = model.to(device)
        if placement.parallel is ParallelMode.dp:
            if device.type == "cuda" and len(device_ids) > 1:
                return nn.DataParallel(model, device_ids=list(device_ids))
            return model
        if not placement.distributed:
            return model
        ids = [device.index] if device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids, **placement.ddp_options)

    def setup(self, model: nn.Module, optimizer: OptimizerRecipe,
              shard_units: Iterable[nn.Module] | None = None) -> tuple[nn.Module, Optimizer]:
        """The model wrapped as this mode needs, and its optimizer, built in the order the mode needs."""
        model = self.wrap(model)
        return model, optimizer.build(model)

    @staticmethod
    def unwrap(model: nn.Module) -> nn.Module:
        """The module the recipe built (DDP, DP and ShardedDDP hold it as ``.module``; FSDP2 is the module)."""
        from torch.nn.parallel import DataParallel, DistributedDataParallel

        if isinstance(model, (DataParallel, DistributedDataParallel)) or type(model).__name__ == "ShardedDataParallel":
            return model.module
        return model

    def no_sync(self, model: nn.Module) -> AbstractContextManager[Any]:
        """The backward passes inside accumulate their gradients on this process without exchanging them (the
        micro-batches before a step's last one); the next backward outside exchanges the sum."""
        from torch.nn.parallel import DistributedDataParallel

        return model.no_sync() if isinstance(model, DistributedDataParallel) else nullcontext()

    # -- full state -----------------------------------------------------------------------------
    def full_state(self, model: nn.Module, optimizer: Optimizer | None, copy: bool = True) -> dict[str, Any] | None:
        """``{"model": ..., "optimizer": ...}`` on rank 0, None elsewhere. Call on every rank (it may communicate)."""
        osd = self._full_optimizer_state(model, optimizer) if optimizer is not None else None
        if not self.placement.place.is_main:
            return None
        state = {"model": self.unwrap(model).state_dict()}
        if optimizer is not None:
            state["optimizer"] = osd
        return cpu_copy(state) if copy else state

    def _full_optimizer_state(self, model: nn.Module, optimizer: Optimizer) -> dict[str, Any] | None:
        return optimizer.state_dict() if self.placement.place.is_main else None

    def load_full_state(self, model: nn.Module, optimizer: Optimizer | None, state: Mapping[str, Any]) -> None:
        """Load a full state (of any mode and world size) on every rank.

        ``state`` keeps all its entries (the loaders that blank or replace entries get a copy of its
        dicts). As with torch's own ``load_state_dict``, optimizer tensors already of the right
        device and dtype may be shared with the optimizer rather than copied.
        """
        self.unwrap(model).load_state_dict(state["model"])
        if optimizer is not None and state.get("optimizer") is not None:
            optimizer.load_state_dict(_structure_copy(state["optimizer"]))

    # -- measures -------------------------------------------------------------------------------
    def local_optimizer(self, optimizer: Optimizer) -> Optimizer:
        """The optimizer whose ``state`` this process holds (a sharded optimizer's inner one)."""
        return optimizer

    def optimizer_state_bytes(self, optimizer: Optimizer) -> int:
        return state_bytes(self.local_optimizer(optimizer).state)


class OSSStrategy(Strategy):
    """``oss``: fairscale's OSS shards the optimizer state; DDP all-reduces the gradients as usual."""

    mode = ShardingMode.oss

    def setup(self, model: nn.Module, optimizer: OptimizerRecipe,
              shard_units: Iterable[nn.Module] | None = None) -> tuple[nn.Module, Optimizer]:
        require(FAIRSCALE)  # validation refuses the mode without it; this says the same to a direct caller
        from fairscale.optim import OSS

        model = super().wrap(model)  # DDP first, then OSS over its parameters (fairscale's documented order)
        optimizer_class, params, kwargs = optimizer.parts(model)
        return model, OSS(params, optim=optimizer_class, **kwargs)

    def _full_optimizer_state(self, model: nn.Module, optimizer: Optimizer) -> dict[str, Any] | None:
        optimizer.consolidate_state_dict(recipient_rank=0)  # collective: every rank sends its shard to rank 0
        if not self.placement.place.is_main:
            return None
        osd = optimizer.state_dict()
        optimizer._all_states = []  # fairscale keeps the gathered shards: drop them, or rank 0 holds it all
        return osd

    def local_optimizer(self, optimizer: Optimizer) -> Optimizer:
        return optimizer.optim


class SDPStrategy(OSSStrategy):
    """``sdp``: fairscale's ShardedDataParallel with OSS (ESPnet2's ``--sharded_ddp``).

    Each gradient is reduced to the rank that owns its optimizer state and dropped elsewhere
    (``sharding.reduce_buffer_size=0``, the default here), so gradients are sharded too.

    ``optimizer.zero_grad()`` goes through ShardedDataParallel's own ``zero_grad``: torch >= 2 sets
    gradients to None by default, which silently detaches them from ShardedDDP's reduce buckets
    (fairscale issue #354) so that stale bucket contents would be reduced at the next step.
    """

    mode = ShardingMode.sdp

    def setup(self, model: nn.Module, optimizer: OptimizerRecipe,
              shard_units: Iterable[nn.Module] | None = None) -> tuple[nn.Module, Optimizer]:
        require(FAIRSCALE)
        from fairscale.nn.data_parallel import ShardedDataParallel
        from fairscale.optim import OSS

        model = model.to(self.placement.device)
        optimizer_class, params, kwargs = optimizer.parts(model)  # ShardedDDP wraps the model with its optimizer
        optimizer = OSS(params, optim=optimizer_class, **kwargs)
        wrapped = ShardedDataParallel(model, optimizer, reduce_buffer_size=self.placement.sharding.reduce_buffer_size)

        def zero_grad(set_to_none: bool = True) -> None:
            wrapped.zero_grad(set_to_none=set_to_none)

        optimizer.zero_grad = zero_grad  # type: ignore[method-assign]
        return wrapped, optimizer

    def no_sync(self, model: nn.Module) -> AbstractContextManager[Any]:
        return model.no_sync() if type(model).__name__ == "ShardedDataParallel" else nullcontext()


class ZeroStrategy(Strategy):
    """``zero``: torch's ZeroRedundancyOptimizer shards the optimizer state; DDP all-reduces the gradients."""

    mode = ShardingMode.zero

    def setup(self, model: nn.Module, optimizer: OptimizerRecipe,
              shard_units: Iterable[nn.Module] | None = None) -> tuple[nn.Module, Optimizer]:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        model = super().wrap(model)
        optimizer_class, params, kwargs = optimizer.parts(model)
        return model, ZeroRedundancyOptimizer(params, optimizer_class=optimizer_class, **kwargs)

    def _full_optimizer_state(self, model: nn.Module, optimizer: Optimizer) -> dict[str, Any] | None:
        optimizer.consolidate_state_dict(to=0)
        if not self.placement.place.is_main:
            return None
        osd = optimizer.state_dict()
        optimizer._all_state_dicts = []  # as for OSS: do not keep every rank's shard on rank 0
        return osd

    def local_optimizer(self, optimizer: Optimizer) -> Optimizer:
        return optimizer.optim


def default_shard_units(model: nn.Module) -> list[nn.Module]:
    """The submodules FSDP2 makes their own units (all-gathered one at a time), before the root.

    The model's children that hold parameters, and the elements of child ModuleLists/ModuleDicts
    (the usual stack of blocks). Units that share a parameter with another unit or with the root's
    own parameters (tied weights) are left to the root: one parameter must live in one unit.
    """
    candidates: list[nn.Module] = []
    for child in model.children():
        if isinstance(child, (nn.ModuleList, nn.ModuleDict)):
            candidates.extend(m for m in child.children() if any(True for _ in m.parameters()))
        elif any(True for _ in child.parameters()):
            candidates.append(child)
    owners: dict[int, int] = {}
    for p in model.parameters(recurse=False):
        owners[id(p)] = owners.get(id(p), 0) + 1
    for unit in candidates:
        for p in unit.parameters():
            owners[id(p)] = owners.get(id(p), 0) + 1
    return [u for u in candidates if all(owners[id(p)] == 1 for p in u.parameters())]


class FSDPStrategy(Strategy):
    """``fsdp``: torch's FSDP2 (``fully_shard``) shards parameters, gradients and optimizer state.

    Parameters become DTensors sharded on dim 0 over all ranks; each unit is all-gathered for its
    forward and backward and freed after (``sharding.reshard_after_forward``). The optimizer is
    built after sharding, over the DTensor parameters, so its state is sharded the same way.
    Calling the model is collective: every rank must run the same forwards (also for evaluation).
    """

    mode = ShardingMode.fsdp

    def setup(self, model: nn.Module, optimizer: OptimizerRecipe,
              shard_units: Iterable[nn.Module] | None = None) -> tuple[nn.Module, Optimizer]:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        placement = self.placement
        model = model.to(placement.device)
        mesh = init_device_mesh(placement.device.type, (placement.place.world_size,))
        reshard = placement.sharding.reshard_after_forward
        units = default_shard_units(model) if shard_units is None else list(shard_units)
        for unit in units:
            if unit is not model:
                fully_shard(unit, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
        return model, optimizer.build(model)  # over the sharded (DTensor) parameters

    @contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        from torch.distributed.fsdp import FSDPModule

        if not isinstance(model, FSDPModule):
            yield
            return
        model.set_requires_gradient_sync(False)  # gradients accumulate unsharded until the last micro-batch
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    def full_state(self, model: nn.Module, optimizer: Optimizer | None, copy: bool = True) -> dict[str, Any] | None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_state_dict,
        )

        # gathered, on the CPU, on rank 0 only (the others get empty dicts): already copies
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        if optimizer is None:
            msd = get_model_state_dict(model, options=options)
            return {"model": msd} if self.placement.place.is_main else None
        msd, osd = get_state_dict(model, optimizer, options=options)
        if not self.placement.place.is_main:
            return None
        return {"model": msd, "optimizer": _by_index(osd, _param_names(model, optimizer))}

    def load_full_state(self, model: nn.Module, optimizer: Optimizer | None, state: Mapping[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_state_dict,
        )

        options = StateDictOptions(full_state_dict=True)  # every rank has the full state: each keeps its shard
        msd = _structure_copy(state["model"])
        if optimizer is None or state.get("optimizer") is None:
            set_model_state_dict(model, msd, options=options)
            return
        osd = _by_name(_structure_copy(state["optimizer"]), _param_names(model, optimizer))
        set_state_dict(model, optimizer, model_state_dict=msd, optim_state_dict=osd, options=options)


def _by_index(osd: Mapping[str, Any], names: list[str]) -> dict[str, Any]:
    """An optimizer state dict keyed by parameter name (torch.distributed.checkpoint) -> keyed by index (torch)."""
    index = {n: i for i, n in enumerate(names)}
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in osd["param_groups"]]
    return {"state": {index[n]: s for n, s in osd["state"].items()}, "param_groups": groups}


def _by_name(osd: Mapping[str, Any], names: list[str]) -> dict[str, Any]:
    """The other way round; checks that the saved optimizer had as many parameters as this one."""
    saved = sum(len(g["params"]) for g in osd["param_groups"])
    if saved != len(names):
        raise ValueError(f"the checkpoint's optimizer has {saved} parameters, this one has {len(names)}")
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in osd["param_groups"]]
    return {"state": {names[i]: s for i, s in osd["state"].items()}, "param_groups": groups}


_STRATEGIES: dict[ShardingMode, type[Strategy]] = {
    ShardingMode.none: Strategy,
    ShardingMode.oss: OSSStrategy,
    ShardingMode.sdp: SDPStrategy,
    ShardingMode.zero: ZeroStrategy,
    ShardingMode.fsdp: FSDPStrategy,
}


def strategy_for(placement: Placement) -> Strategy:
    """The strategy of ``placement.sharding.mode``; plain (``none``) where there is nothing to shard across."""
    mode = placement.sharding.mode
    if mode not in _STRATEGIES:
        raise ValueError(f"sharding={mode.value} is not offered (validation refuses it): use sharding=fsdp")
    if mode is not ShardingMode.none and not placement.distributed:
        dp = placement.parallel is ParallelMode.dp
        _notice(placement, f"sharding={mode.value} with {'parallel=dp' if dp else 'world size 1'} "
                           f"shards nothing: training runs unsharded (as sharding=none)")
        return Strategy(placement)
    return _STRATEGIES[mode](placement)
