"""One process of a job, from its environment to its exit: device, process group, recipe, teardown."""

from __future__ import annotations

import ctypes
import faulthandler
import functools
import gc
import datetime
import json
import os
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from runner.plan.processes import ProcessRecord
from runner.spec.schema import DeviceKind, JobConfig, RecipeConfig
from runner.common.signals import StopRequest, stop_signal
from runner.spec.targets import load_target

if TYPE_CHECKING:
    from runner.worker.preflight import HostReport

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class RankSetup:
    """Everything one process needs, decided before it starts (inherited through fork, or built by a task)."""

    spec: JobConfig
    recipe: RecipeConfig  # what the runner reads of the recipe config
    recipe_cfg: DictConfig  # what the recipe function receives
    record: ProcessRecord
    world_size: int
    backend: str
    device: DeviceKind
    init_method: str  # concrete: env://, tcp://addr:port, file:///path
    env: dict[str, str]  # the torchrun-compatible variables of this process
    output_dir: str
    log_file: str
    error_file: str
    done_file: str
    echo: bool  # also show this rank's stdout on the launching terminal
    notes: tuple[str, ...] = ()  # what the launch decided for this process (its interface, ...), for its log
    preflight: HostReport | None = None  # preflight=true: its host's checks, on the process that prints its line


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies, so no rank outlives its launcher."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def write_error(setup: RankSetup, exc: BaseException) -> None:
    """Our own failure record: which rank, where, when, and the traceback, for the launcher's report."""
    record = {
        "rank": setup.record.global_rank,
        "local_rank": setup.record.local_rank,
        "host": setup.record.host,  # as the plan names it (every namespace host has the machine's name)
        "machine": socket.gethostname(),
        "pid": os.getpid(),
        "timestamp": time.time(),
        "exception": f"{type(exc).__name__}: {exc}",
        "traceback": "".join(traceback.format_exception(exc)),
    }
    tmp = setup.error_file + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, setup.error_file)


STACK_SIGNAL = signal.SIGQUIT  # a rank writes every thread's Python stack to its log (the launcher asks
# the ranks that did not arrive at a collective that timed out; Ctrl-\ too)
TIMEOUT_PAUSE_S = 1.0  # a rank whose collective timed out waits this long before exiting, so that its
# launcher can ask the ranks it waited for where they are


def joined_file(setup: RankSetup) -> Path:
    return Path(setup.done_file).with_suffix(".joined")


def returned_on_request(done_file: str | Path) -> bool:
    """A rank's done file says its recipe returned because it was asked to stop (and checkpointed),
    not at the end of its work."""
    return Path(done_file).read_text().strip() == "stopped"


def clear_outcome(setup: RankSetup) -> None:
    """Forget an earlier attempt's outcome files of this rank (a restarted or requeued job)."""
    for path in (setup.error_file, setup.done_file, joined_file(setup)):
        Path(path).unlink(missing_ok=True)


def is_timeout_text(text: str) -> bool:
    """An error's text says it timed out (gloo, c10d stores, NCCL all word it so)."""
    text = text.lower()
    return "timed out" in text or "timeout" in text


def run_rank(setup: RankSetup) -> None:
    """The body of one rank. Exceptions are recorded, then re-raised for the process context to see."""
    from runner.worker.logs import redirect_output

    die_with_parent()
    # Everything inherited from the launcher (torch, Hydra, ...) stays alive for the rank's life:
    # keep it out of the cyclic GC's full passes, which would otherwise walk it again and again
    # (and touch, so copy, its pages).
    gc.freeze()
    # the launcher's handlers were inherited through fork: a rank dies on SIGTERM, Ctrl-C interrupts it
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    StopRequest.install(stop_signal(setup.spec.launcher.slurm.signal))
    os.environ.update(setup.env)
    if setup.spec.workdir:
        os.chdir(setup.spec.workdir)  # the job's folder (runner.spec.targets): relative paths mean the same on every host
    redirect_output(setup.log_file, setup.echo)
    attempt = int(setup.env.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if attempt:
        print(f"== attempt {attempt + 1} (restart {attempt}) ==", file=sys.stderr, flush=True)
    for note in setup.notes:
        print(note, file=sys.stderr, flush=True)
    faulthandler.register(STACK_SIGNAL, file=sys.stderr, all_threads=True)
    try:
        _run(setup)
    except BaseException as exc:
        write_error(setup, exc)
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        if is_timeout_text(f"{type(exc).__name__}: {exc}"):
            time.sleep(TIMEOUT_PAUSE_S)
        raise
    # (read by returned_on_request)
    Path(setup.done_file).write_text("stopped\n" if StopRequest.requested else "")


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


def _run(setup: RankSetup) -> None:
    import torch
    import torch.distributed as dist

    from runner.training.context import Place, RunContext

    rec = setup.record
    # torch was imported before the fork: its thread pool follows the launcher, not this process's
    # OMP_NUM_THREADS, unless told here
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or max(1, (os.cpu_count() or 1) // rec.local_world_size)))
    if setup.device is DeviceKind.cuda:
        torch.cuda.set_device(rec.device_ids[0])
        device = torch.device("cuda", rec.device_ids[0])
    else:
        device = torch.device("cpu")
    if setup.spec.preflight:  # no recipe: one all-reduce with the exact spec (runner.worker.preflight)
        from runner.worker.preflight import collective

        collective(setup, device)
        return
    recipe = load_target(setup.recipe.target, setup.spec.workdir)
    manages_group = getattr(sys.modules[recipe.__module__], "MANAGES_PROCESS_GROUP", False)
    timeout = datetime.timedelta(seconds=setup.spec.init.timeout_s)
    if manages_group:
        _watch_own_process_group(timeout, joined_file(setup))
    else:
        dist.init_process_group(setup.backend, init_method=setup.init_method, rank=rec.global_rank,
                                world_size=setup.world_size, timeout=timeout)
        joined_file(setup).touch()
    torch.manual_seed(setup.recipe.seed)
    place = Place(rec.global_rank, rec.local_rank, rec.node_rank, setup.world_size, rec.local_world_size, rec.host)
    ctx = RunContext(place, device, rec.device_ids, setup.spec.parallel.mode, setup.recipe.global_batch_size,
                     setup.recipe.seed, Path(setup.output_dir), setup.spec.parallel.find_unused_parameters,
                     setup.spec.parallel.bucket_cap_mb, setup.spec.sharding,
                     attempt=int(setup.env.get("TORCHELASTIC_RESTART_COUNT", "0")))
    try:
        recipe(ctx, setup.recipe_cfg)
    finally:
        ctx.close()
    if dist.is_initialized():
        dist.destroy_process_group()
