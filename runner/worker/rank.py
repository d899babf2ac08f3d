"""One process of a job, from its environment to its exit: device, process group, recipe, teardown."""

from __future__ import annotations

import ctypes
import datetime
import faulthandler
import functools
import gc
import math
import os
import signal
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runner.common.signals import StopRequest
from runner.common.timeouts import is_timeout_text
from runner.environments import provenance
from runner.plan.diagnostics import request_dumps
from runner.spec.schema import DeviceKind
from runner.spec.targets import load_target
from runner.worker.setup import RankSetup
from runner.worker.watch import Watch

_PR_SET_PDEATHSIG = 1
STACK_SIGNAL = signal.SIGQUIT  # a rank writes every thread's Python stack to its log (the launcher asks
# the ranks that did not arrive at a collective that timed out; Ctrl-\ too)
TIMEOUT_PAUSE_S = 1.0  # a rank whose collective timed out waits this long before exiting, so that its
# launcher can ask the ranks it waited for where they are


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies, so no rank outlives its launcher."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def run_rank(setup: RankSetup) -> None:
    """The body of one rank. Exceptions are recorded, then re-raised for the process context to see."""
    from runner.training.output import finish as finish_output
    from runner.training.output import redirect_output

    die_with_parent()
    # Everything inherited from the launcher (torch, Hydra, ...) stays alive for the rank's life:
    # keep it out of the cyclic GC's full passes, which would otherwise walk it again and again
    # (and touch, so copy, its pages).
    gc.freeze()
    # the launcher's handlers were inherited through fork: a rank dies on SIGTERM, Ctrl-C interrupts it
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    StopRequest.install(setup.stop_signal)
    os.environ.update(setup.env)
    if setup.spec.workdir:
        os.chdir(setup.spec.workdir)  # the job's folder (runner.spec.targets): relative paths mean the same on every host
    redirect_output(str(setup.log_file), setup.echo, setup.prefix)
    if setup.paths.attempt:
        print(f"== attempt {setup.paths.attempt + 1} (restart {setup.paths.attempt}) ==", file=sys.stderr, flush=True)
    for note in setup.notes:
        print(note, file=sys.stderr, flush=True)
    faulthandler.register(STACK_SIGNAL, file=sys.stderr, all_threads=True)
    watch = None if setup.spec.preflight else Watch(setup)
    try:
        if watch is not None:
            watch.begin()
        result = _run(setup)
    except BaseException as exc:
        setup.outcome.record_error(setup.error_record(exc))
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        if is_timeout_text(f"{type(exc).__name__}: {exc}"):
            if watch is not None:  # every rank says where it is (runner.plan.diagnostics), this one first
                request_dumps(setup.paths, "timeout")
                watch.dump("timeout")
            time.sleep(TIMEOUT_PAUSE_S)
        raise
    finally:
        finish_output()
    if watch is not None:
        watch.finish()
    setup.outcome.mark_done(StopRequest.requested, _plain_result(result))


def _plain_result(result: Any) -> dict[str, Any]:
    """What a recipe returned, as its run records it: the entries of a mapping that are plain finite numbers,
    strings or booleans (its final metrics, for the run's summary); nothing for anything else."""
    if not isinstance(result, Mapping):
        return {}
    kept = {}
    for key, value in result.items():
        if hasattr(value, "item") and callable(value.item):  # a 0-d tensor or numpy scalar
            try:
                value = value.item()
            except (TypeError, ValueError, RuntimeError):
                continue
        if isinstance(value, (bool, int, str)) or (isinstance(value, float) and math.isfinite(value)):
            kept[str(key)] = value
    return kept


def _watch_own_process_group(timeout: datetime.timedelta, joined: Path) -> None:
    """For a recipe that makes its own process group (a torchrun-style script): the groups it makes
    without a timeout get init.timeout_s rather than torch's 30 minutes (torch reads these public defaults
    when ``timeout`` is None), and joining is marked as for a recipe's group, so a hang in its collectives
    is reported the same way (runner.worker.failures)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    c10d.default_pg_timeout = timeout
    c10d.default_pg_nccl_timeout = timeout
    original = c10d.init_process_group

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> None:
        original(*args, **kwargs)
        joined.touch()

    c10d.init_process_group = dist.init_process_group = init_process_group


def _run(setup: RankSetup) -> Any:
    import torch
    import torch.distributed as dist

    from runner.training.context import ContextSettings, RunContext

    rec = setup.record
    # torch was imported before the fork: its thread pool follows the launcher, not this process's
    # OMP_NUM_THREADS (set in its environment: runner.environments.child), unless told here
    torch.set_num_threads(int(setup.env["OMP_NUM_THREADS"]))
    if setup.device is DeviceKind.cuda:
        torch.cuda.set_device(rec.device_ids[0])
        device = torch.device("cuda", rec.device_ids[0])
    else:
        device = torch.device("cpu")
    if setup.spec.preflight:  # no recipe: one all-reduce with the exact spec (runner.worker.preflight)
        from runner.worker.preflight.collective import collective

        collective(setup, device)
        return None
    recipe = load_target(setup.recipe.target, setup.spec.code_dir or setup.spec.workdir)
    timeout = datetime.timedelta(seconds=setup.spec.init.timeout_s)
    if setup.recipe.init_process_group:
        dist.init_process_group(setup.backend, init_method=setup.init_method, rank=rec.global_rank,
                                world_size=setup.world_size, timeout=timeout)
        setup.outcome.mark_joined()
    else:
        _watch_own_process_group(timeout, setup.outcome.joined_file)
    torch.manual_seed(setup.recipe.seed)
    paths = setup.paths
    if rec.global_rank == 0:
        provenance.add_runtime(paths.provenance, provenance.runtime(setup.device.value), rec.host, paths.attempt)
    ctx = RunContext(ContextSettings(
        rec.global_rank, rec.local_rank, rec.node_rank, setup.world_size, rec.local_world_size, rec.host, device,
        rec.device_ids, setup.spec.parallel, setup.spec.sharding, setup.recipe.global_batch_size, setup.recipe.seed,
        paths.root, paths.metrics, paths.checkpoints, paths.attempt))
    try:
        result = recipe(ctx, setup.recipe_cfg)
    finally:
        ctx.close()
    if dist.is_initialized():
        dist.destroy_process_group()
    return result
