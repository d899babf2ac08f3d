"""One rank's body, in its own process (runner.worker.rank_process): its environment and folder, then either a
recipe function under the runner's process group, or a torchrun-style script as its main program
(runner.worker.script); its outcome files (runner.records.outcomes); its exit status."""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import math
import os
import signal
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from runner.common import exits
from runner.common.signals import StopRequest
from runner.spec.elastic import keeps_checkpoints_on_every_host
from runner.spec.targets import load_target
from runner.training.output import AgentChannel
from runner.training.progress import StepCount
from runner.worker.channel import JobChannel, channel_of
from runner.worker.rank_body import exit_status, failed, watch_process_groups
from runner.worker.rank_process import STACK_SIGNAL
from runner.worker.setup import RankSetup
from runner.worker.watch import Watch

INIT_BARRIER = "TORCH_DIST_INIT_BARRIER"  # torch's switch for a store-based barrier at the end of init_process_group


@dataclass(frozen=True, kw_only=True)
class RankServices:
    """What a recipe's rank makes once for itself and hands to its run context: its channel to its host agent, its
    stop request (installed on the stop signal), the count of its progress steps (its watch reads it)."""

    agent: AgentChannel
    stop: StopRequest
    steps: StepCount


def rank_main(setup: RankSetup, events_fd: int) -> int:
    """The body of one rank (runner.worker.zygote forks it); its exit status. A recipe's stop request is installed
    first: the stop signal was held (blocked) since the fork (runner.worker.attempt.start_ranks), so one sent before
    now is a request the recipe sees at its first ``ctx.should_stop()``, not the end of the rank."""
    stop = StopRequest()  # a recipe's: it asks it through its run context (ctx.should_stop); a script's is SIGTERM
    if not setup.runs_script:
        stop.install(setup.stop_signal)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [setup.stop_signal])
    os.environ.update(setup.env)
    # forked, not started: a temp folder the zygote's tempfile cached is not this process's; a fresh interpreter
    # takes TMPDIR from its environment (the run's scratch folder: runner.environments.child)
    tempfile.tempdir = None
    if setup.spec.workdir:
        os.chdir(setup.spec.workdir)  # the job's folder (runner.spec.targets): relative paths mean the same on every host
    agent = AgentChannel(events_fd, setup.echo.live_bar)
    if setup.paths.attempt:
        agent.note(f"== attempt {setup.paths.attempt + 1} (restart {setup.paths.attempt}) ==")
    for note in setup.notes:
        agent.note(note)
    faulthandler.register(STACK_SIGNAL, file=sys.stderr, all_threads=True)
    use_threads(setup)
    channel = rank_channel(setup)
    if setup.runs_script:
        from runner.worker.script import run_script

        code = run_script(setup, channel, agent)
    else:
        code = _run_recipe(setup, channel, RankServices(agent=agent, stop=stop, steps=StepCount()))
    agent.life("returned")  # what is left is the process's own end (runner.worker.rank_process.exit_like_python)
    return code


def rank_channel(setup: RankSetup) -> JobChannel | None:
    """This rank's end of its job's channel (runner.worker.channel): where it answers requests to say where it is,
    and says it joined, whatever host asks."""
    spec = setup.spec
    return channel_of(setup.paths, spec.init, setup.env.get("MASTER_ADDR"), setup.env.get("MASTER_PORT"),
                      spec.init.timeout_s)


def use_threads(setup: RankSetup) -> None:
    """torch was imported before the fork: its thread pool follows the agent, not this process's OMP_NUM_THREADS
    (set in its environment: runner.environments.child), unless told here."""
    import torch

    torch.set_num_threads(int(setup.env["OMP_NUM_THREADS"]))


def _run_recipe(setup: RankSetup, channel: JobChannel | None, services: RankServices) -> int:
    watch = None if setup.spec.preflight else Watch(setup, channel, services.steps, services.agent)
    try:
        if watch is not None:
            watch.begin()
        result = _run(setup, channel, services)
    except SystemExit as e:
        code = exit_status(e)
        if code:
            failed(setup, e, watch)
        return code
    except KeyboardInterrupt as e:  # Ctrl-C: its agent stops the job, and says so
        setup.outcome.record_error(setup.error_record(e, ""))
        return exits.from_signal(signal.SIGINT)
    except BaseException as e:  # noqa: BLE001 (recorded, shown, and the status says it)
        failed(setup, e, watch)
        return 1
    if watch is not None:
        watch.finish()
    setup.outcome.mark_done(services.stop.requested, _plain_result(result))
    _destroy_process_group()
    return 0


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


@contextlib.contextmanager
def _barrier_after_init(backend: str) -> Iterator[None]:
    """init_process_group waits until every rank has made the group (torch's store-based barrier, asked for by
    TORCH_DIST_INIT_BARRIER=1 for this call alone: the recipe's environment is what it was). gloo lets a rank out once
    its own side is connected; one whose recipe then returned at once closed its sockets while a slower rank was still
    connecting ("Connection closed by peer" in connectFullMesh, on a busy machine). Through the store, not a
    collective: the recipe's collectives keep their numbers (hang reports name them). MPI has no such race."""
    if backend == "mpi":
        yield
        return
    before = os.environ.get(INIT_BARRIER)
    os.environ[INIT_BARRIER] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ[INIT_BARRIER]
        else:
            os.environ[INIT_BARRIER] = before


def _run(setup: RankSetup, channel: JobChannel | None, services: RankServices) -> Any:
    import torch
    import torch.distributed as dist

    from runner.training.context import ContextSettings, RunContext

    place = setup.place
    device = torch.device(place.device)  # the plan's: cpu, or cuda:<i> with i its first GPU (device_ids[0])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if setup.spec.preflight:  # no recipe: one all-reduce with the exact spec (runner.worker.preflight)
        from runner.worker.preflight.collective import collective

        collective(setup, device)
        return None
    recipe = load_target(setup.recipe.target, setup.spec.code_dir or setup.spec.workdir)
    watch_process_groups(setup, channel, services.agent, own=not setup.recipe.init_process_group)
    if setup.recipe.init_process_group:
        with _barrier_after_init(setup.backend):
            dist.init_process_group(setup.backend, init_method=setup.init_method, rank=place.global_rank,
                                    world_size=place.world_size,
                                    timeout=datetime.timedelta(seconds=setup.spec.init.timeout_s))
    torch.manual_seed(setup.recipe.seed)
    paths = setup.paths
    ctx = RunContext(ContextSettings(
        place=place, parallel=setup.spec.parallel, sharding=setup.spec.sharding,
        global_batch_size=setup.recipe.global_batch_size, micro_batch_size=setup.recipe.micro_batch_size,
        seed=setup.recipe.seed, output_dir=paths.root,
        metrics_file=paths.metrics, checkpoint_dir=paths.checkpoints, attempt=paths.attempt, stop=services.stop,
        steps=services.steps, agent=services.agent, keep_on_every_host=keeps_checkpoints_on_every_host(setup.spec)))
    try:
        return recipe(ctx, setup.recipe_cfg)
    finally:
        ctx._close()  # noqa: SLF001 (the worker owns the context it made)


def _destroy_process_group() -> None:
    """The runner's group, destroyed once the rank's result is recorded: ``~ProcessGroupGloo`` can hang with the GIL
    held (torch's own race with gloo's worker thread); the rank's agent then ends it, and its result stands
    (runner.worker.rank_life)."""
    import torch.distributed as dist

    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception as e:  # noqa: BLE001 (the work is done and recorded: say it, and end as done)
            print(f"runner: destroying the process group raised {type(e).__name__}: {e}", file=sys.stderr, flush=True)
