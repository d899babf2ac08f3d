"""Start one host's share of a plan: fork its processes from this (torch-holding) process and watch them.

Used by launcher=local, by launcher=manual on each host, and by per-host scheduler tasks. Processes
are started and stopped by torch.distributed.elastic's process context (start method fork: the ranks
inherit the already imported torch, which is safe because this process never initialises CUDA). For
env:// and tcp:// init, host 0's launching process hosts the rendezvous store, as torchrun's agent
does (TORCHELASTIC_USE_AGENT_STORE), so the port is held from the moment it is chosen.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import signal
import sys
import tempfile
import time

from omegaconf import DictConfig

from runner.common import exits
from runner.common.signals import StopRequest, handling
from runner.common.timeouts import is_timeout_text
from runner.environments.child import child_environment
from runner.environments.process import ProcessEnvironment
from runner.plan.diagnostics import clear_diagnosis, collect_dumps, diagnose, request_dumps
from runner.plan.paths import RunPaths
from runner.plan.processes import Deferred, Plan
from runner.spec.schema import InitMethod, recipe_settings
from runner.spec.validation import console_ranks
from runner.worker.attempts import AttemptError, Attempts
from runner.worker.network import NetworkError, network_choice
from runner.worker.preflight import collective as preflight_collective
from runner.worker.preflight import host as preflight_host
from runner.worker.preflight.checks import Check, HostReport
from runner.worker.rank import STACK_SIGNAL, run_rank
from runner.worker.rendezvous import Rendezvous, RendezvousError, prepare_rendezvous
from runner.worker.setup import RankSetup


STOP_DUMP_WAIT_S = 2.0  # how long a stop waits for the ranks to say where they are


class Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def rank_setups(plan: Plan, node_rank: int, rdzv: Rendezvous, paths: RunPaths, recipe_cfg: DictConfig,
                environment: ProcessEnvironment, preflight: HostReport | None = None) -> list[RankSetup]:
    """Raises NetworkError when this host cannot reach the master. ``preflight``: this host's checks,
    for its local rank 0 to complete and print (preflight=true)."""
    job = plan.job
    setups = []
    network = network_choice(plan, node_rank, environment)
    notes = (*rdzv.notes, *([network.note] if network else []))
    console = str(job.spec.log.console)
    chosen = console_ranks(console)
    for rec in plan.host_records(node_rank):
        echo = rec.local_rank == 0 if console == "main" else (console == "all" or rec.global_rank in chosen)
        prefix = "" if console == "main" else f"[rank {rec.global_rank} {rec.host}] "
        env = child_environment(plan, rec, paths, environment, master_port=rdzv.master_port,
                                agent_store=rdzv.agent_store, network=network.env if network else {})
        setups.append(RankSetup(job.spec, recipe_settings(job.spec.recipe), recipe_cfg, rec, plan.world_size,
                                job.backend.value, job.device, rdzv.init_method, env, paths, plan.rules.stop_signal,
                                echo=echo, prefix=prefix, notes=notes,
                                preflight=preflight if rec.local_rank == 0 else None))
    return setups


def _preflight_host(plan: Plan, node_rank: int, paths: RunPaths,
                    environment: ProcessEnvironment) -> tuple[Rendezvous, HostReport] | int:
    """preflight=true: this host's checks, before any rank starts (runner.worker.preflight); then its part of
    the rendezvous, as in a real run. The rendezvous and the host's report so far, or the exit status
    when a check failed (its line printed)."""
    report, port = preflight_host.host_checks(plan, node_rank, environment)
    if not report.failed:
        if port is not None:  # host 0 tested this one (a free one, where the launch picks it)
            plan = dataclasses.replace(plan, master_port=str(port))
        try:
            return prepare_rendezvous(plan, node_rank, paths), report
        except RendezvousError as e:
            report = report.add(Check.failed(e.message, e.hint))
    print(report.line(), flush=True)
    return exits.FAILED


def _exit_code_now(pid: int) -> int | None:
    """The exit code of this process's child ``pid`` if it has ended (a negative signal number when a
    signal killed it), without reaping it: its process context still waits for it."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return None
    if info is None:
        return None
    return -info.si_status if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED) else info.si_status


def _wait(context, setups: list[RankSetup], attempts: Attempts | None = None) -> tuple[object | None, dict[int, int]]:
    """Wait for the host's processes; the result (None: another host said its share failed, ``attempts``), and
    the local ranks that died without a Python exception (a signal from outside, os._exit, a crash in C) -> exit
    code, seen before the launcher stops the others.

    When one of them times out in a collective, first ask those still running (not failed, not done) for
    their stacks (runner.worker.rank.STACK_SIGNAL): the report shows where the ranks that did not arrive were."""
    asked = False
    pids = context.pids()
    killed: dict[int, int] = {}
    polled = time.monotonic()
    while True:
        if attempts is not None and time.monotonic() - polled >= 0.5:
            polled = time.monotonic()
            if attempts.other_failed():
                return None, killed
        for i, pid in pids.items():
            outcome = setups[i].outcome
            if i not in killed and (code := _exit_code_now(pid)) not in (None, 0) and not outcome.failed \
                    and not outcome.done:
                killed[i] = code
        if (result := context.wait(timeout=0)) is not None:
            return result, killed
        if not asked:
            failed = [s for s in setups if s.outcome.failed]
            if any(is_timeout_text(s.outcome.error_file.read_text(errors="replace")) for s in failed):
                asked = True
                for i, s in enumerate(setups):
                    if s not in failed and not s.outcome.done:
                        try:
                            os.kill(pids[i], STACK_SIGNAL)
                        except ProcessLookupError:
                            pass
        time.sleep(0.05)


def launch_host(plan: Plan, node_rank: int, paths: RunPaths, recipe_cfg: DictConfig,
                environment: ProcessEnvironment, announce: bool = False, restarts: int = 0) -> int:
    """Run host ``node_rank``'s processes to the end, starting them again after a failure up to ``restarts``
    times (the launcher's say: launcher.max_restarts for local and manual; a scheduler restarts its own tasks);
    return the exit status for `run`. The hosts of a job restart together, agreeing on the attempt through host
    0's store (runner.worker.attempts). ``announce``: say in a line that the host's processes finished (a Slurm
    or MPI task, whose `run` is elsewhere; `run` itself ends with its summary)."""
    attempts = Attempts(plan, node_rank) if restarts and len(plan.job.hosts) > 1 else None
    try:
        if attempts is not None and node_rank != 0:
            paths = dataclasses.replace(paths, attempt=attempts.wait_for(paths.attempt))
        while True:
            code = _launch_attempt(plan, node_rank, paths, recipe_cfg, environment, announce, attempts)
            if attempts is not None:
                attempts.close()  # host 0: the attempt's store goes now, freeing the port for the next one's
            if code != exits.FAILED or paths.attempt >= restarts or StopRequest.requested:
                return code
            following = paths.attempt + 1
            if attempts is not None and node_rank != 0:
                following = attempts.wait_for(following)
            paths = dataclasses.replace(paths, attempt=following)
            print(f"\nrestarting: attempt {paths.attempt + 1} of {restarts + 1} (launcher.max_restarts={restarts}); "
                  f"the recipe resumes from its last checkpoint", file=sys.stderr, flush=True)
    except AttemptError as e:
        print(f"error: restart: {e}", file=sys.stderr)
        return exits.FAILED
    finally:
        if attempts is not None:
            attempts.close()


def _master_unreachable(plan: Plan, node_rank: int, rdzv: Rendezvous, setups: list[RankSetup]) -> str | None:
    """On a host other than host 0 (env/tcp init): why the master's store cannot be reached, within
    init.timeout_s (host 0 may start later), naming the address, port and interface tried; None: reachable."""
    from runner.worker.network import resolve
    from runner.worker.preflight.checks import check_reachable

    if node_rank == 0 or plan.job.spec.init.method is InitMethod.file or isinstance(plan.master_addr, Deferred):
        return None
    port = int(rdzv.master_port)
    ifname = setups[0].env.get("GLOO_SOCKET_IFNAME") if setups else None
    check = check_reachable(resolve(plan.master_addr), port, plan.job.spec.init.timeout_s, ifname)
    if check.ok:
        return None
    return f"the master {plan.master_addr}:{port} cannot be reached from this host: {check.failure}" + \
        (f"; hint: {check.hint}" if check.hint else "")


def _launch_attempt(plan: Plan, node_rank: int, paths: RunPaths, recipe_cfg: DictConfig,
                    environment: ProcessEnvironment, announce: bool, attempts: Attempts | None = None) -> int:
    from torch.distributed.elastic.multiprocessing import start_processes
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from runner.worker.failures import report as failure_report
    from runner.worker.logs import RankLogs

    # the failure report below says what matters; elastic's own error dump would bury it
    for name in ("torch.distributed.elastic", "torch.multiprocessing"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    report = None  # preflight=true: this host's checks, which its local rank 0 completes
    if plan.job.spec.preflight:
        checked = _preflight_host(plan, node_rank, paths, environment)
        if isinstance(checked, int):
            return checked
        rdzv, report = checked
    try:
        if report is None:
            rdzv = prepare_rendezvous(plan, node_rank, paths)
        setups = rank_setups(plan, node_rank, rdzv, paths, recipe_cfg, environment, report)
    except RendezvousError as e:
        print(f"error: init: {e}", file=sys.stderr)
        return exits.INVALID
    except NetworkError as e:
        print(f"error: network: {e}", file=sys.stderr)
        return exits.INVALID
    if attempts is not None and node_rank == 0 and rdzv.store is not None:
        attempts.opened(rdzv.store, paths.attempt)
    unreachable = _master_unreachable(plan, node_rank, rdzv, setups) if report is None else None
    if unreachable:
        print(f"error: init: {unreachable}", file=sys.stderr)
        return exits.FAILED
    for s in setups:
        s.outcome.clear()
    if node_rank == 0:
        clear_diagnosis(paths)
    # Not imported here, though every DDP rank imports it: torch._dynamo. Forked after that import,
    # ranks deadlocked at teardown (~ProcessGroupGloo joins a gloo thread that waits for the GIL to
    # free a Python object in its thread-local state); seen here on 1 of 31 runs (benchmarks/REPORT.md).
    stop = plan.rules.stop_signal
    launcher_pid, ranks = os.getpid(), []

    def forward_stop(signum: int, _frame: object) -> None:  # a stop request is for the ranks to act on
        if os.getpid() != launcher_pid:
            return  # a rank that has not installed its own handler yet (it inherits the request below)
        StopRequest.requested = True  # ranks not started yet start asked
        print(f"{signal.Signals(signum).name}: asking {len(setups)} process(es) to checkpoint and stop", file=sys.stderr)
        for pid in ranks:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    # torch.multiprocessing leaves a pytorch-errorfile-*.pickle in the temp folder for every rank that
    # raises: keep those (and the ranks' own temp files) in the run folder, and remove them after
    scratch = paths.root / "tmp"
    scratch.mkdir(exist_ok=True)
    previous_tmp, tempfile.tempdir = tempfile.tempdir, str(scratch)
    started = time.perf_counter()
    context = None
    # the handlers stay until the processes are closed: a second Ctrl-C must not cut that short
    with handling((signal.SIGINT, signal.SIGTERM), _raise_signal), handling((stop,), forward_stop):
        try:
            context = start_processes(
                name="rank",
                entrypoint=run_rank,
                args={i: (s,) for i, s in enumerate(setups)},
                envs={i: dict(s.env) for i, s in enumerate(setups)},
                logs_specs=RankLogs(paths, [s.record.global_rank for s in setups]),
                start_method="fork",
            )
            ranks.extend(context.pids().values())
            result, killed = _wait(context, setups, attempts)
            if result is None:  # another host's share failed: end this one's, and start the next attempt together
                print(f"\nanother host's processes failed: stopping this host's {len(setups)} (attempt "
                      f"{paths.attempt + 1})", file=sys.stderr, flush=True)
                return exits.FAILED
            context = None
            if report is not None:
                return preflight_collective.outcome(result, setups, paths)
            code = failure_report(result, setups, paths, time.perf_counter() - started, killed, announce)
            if code == exits.FAILED and attempts is not None:
                attempts.say_failed()
            return code
        except (Interrupted, SignalException) as e:
            # ours before the processes start, elastic's (it installs its own handlers) after
            signum = e.signum if isinstance(e, Interrupted) else int(e.sigval)
            for s in (signal.SIGINT, signal.SIGTERM):  # one is enough (Ctrl-C may arrive twice, forwarded too)
                signal.signal(s, signal.SIG_IGN)
            if signum == signal.SIGTERM and context is not None and ranks and _grace(context, ranks, setups, plan, stop):
                context = None
            print(f"\n{signal.Signals(signum).name}: stopping {len(setups)} process(es) ...", file=sys.stderr)
            return exits.from_signal(signum)
        finally:
            if context is not None:
                context.close(death_sig=signal.SIGTERM, timeout=5)
            tempfile.tempdir = previous_tmp
            shutil.rmtree(scratch, ignore_errors=True)
            rdzv.close()


def _grace(context, ranks: list[int], setups: list[RankSetup], plan: Plan, stop: int) -> bool:
    """A polite stop (SIGTERM from a scheduler or a shutdown): the ranks may checkpoint first
    (ctx.should_stop), for launcher.grace_s. Whether they all ended by then (the context is closed)."""
    grace = plan.job.spec.launcher.grace_s
    if grace <= 0:
        return False
    print(f"\nSIGTERM: asking {len(setups)} process(es) to checkpoint and stop (launcher.grace_s={grace:g}) ...",
          file=sys.stderr, flush=True)
    StopRequest.requested = True
    for pid in ranks:
        try:
            os.kill(pid, stop)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if context.wait(timeout=0) is not None:  # all returned (or one failed): closed already
            return True
        time.sleep(0.05)
    # still running after their grace: stuck somewhere, say where before they are stopped
    paths, world = setups[0].paths, plan.world_size
    found = diagnose(collect_dumps(paths, range(world), request_dumps(paths, "stop"), STOP_DUMP_WAIT_S), world)
    if found is not None:
        print(f"where the ranks were, {grace:g} s after the stop request: {found.text}", file=sys.stderr, flush=True)
    return False


def _raise_signal(signum: int, _frame: object) -> None:
    raise Interrupted(signum)
