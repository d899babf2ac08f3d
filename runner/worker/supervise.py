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
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig

import runner.worker.preflight as preflight
from runner.worker.network import InterfaceChoice, NetworkError, choose_interface
from runner.plan.paths import RunPaths
from runner.plan.processes import Deferred, Plan
from runner.worker.preflight import HostReport
from runner.worker.rank import RankSetup, clear_outcome, run_rank
from runner.spec.schema import InitMethod, recipe_settings
from runner.common.signals import StopRequest, stop_signal

EXIT_FAILED = 1


class Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass
class Rendezvous:
    """The concrete meeting point of one run, and what this host holds open for it."""

    init_method: str
    env: dict[str, str]
    store: tuple | None = None  # (TCPStore, listening socket) this host serves, kept alive for the run
    file: Path | None = None  # the init file, removed afterwards
    notes: list[str] = field(default_factory=list)

    def close(self) -> None:
        self.store = None
        if self.file is not None:
            self.file.unlink(missing_ok=True)
            try:
                self.file.parent.rmdir()  # the run's private folder, once no attempt's file is left
            except OSError:
                pass


class RendezvousError(Exception):
    """The meeting point cannot be made; ``hint`` says what to do (also in str())."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(f"{message}; hint: {hint}" if hint else message)
        self.message = message
        self.hint = hint


def _serve_store(addr: str, port: int, single_host: bool, timeout_s: float) -> tuple[tuple, int]:
    """Serve the rendezvous TCPStore from this process on a socket we bind ourselves: loopback only for
    one host, and the port is ours from the moment it is chosen (no free-port race)."""
    import datetime

    import torch.distributed as dist

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    bind = "127.0.0.1" if single_host else "0.0.0.0"
    try:
        sock.bind((bind, port))
    except OSError as e:
        if not single_host:  # the other hosts were told this port
            raise RendezvousError(f"cannot listen on {bind}:{port} for the rendezvous store: {e.strerror}",
                                  "another job holds the port; leave init.master_port=0, or pick another") from None
        sock.bind((bind, 0))  # one host: nobody else needs to know the port, take a free one
        print(f"warning: init.master_port={port} is in use on this machine ({e.strerror}); using the free port "
              f"{sock.getsockname()[1]} instead", file=sys.stderr)
    sock.listen(1024)
    store = dist.TCPStore(addr, sock.getsockname()[1], None, True, datetime.timedelta(seconds=timeout_s),
                          wait_for_workers=False, master_listen_fd=sock.fileno())
    return (store, sock), sock.getsockname()[1]


def stale_rendezvous_file(path: Path) -> None:
    if path.exists():
        raise RendezvousError(f"init file {path} already exists (a stale file from an earlier run?); it is "
                              f"never reused", "remove it or start a new run")


def prepare_rendezvous(plan: Plan, node_rank: int, paths: RunPaths) -> Rendezvous:
    spec = plan.job.spec
    single = len(plan.job.hosts) == 1
    env = {"TORCHELASTIC_RUN_ID": paths.run_id, "TORCHELASTIC_RESTART_COUNT": str(paths.attempt),
           "TORCHELASTIC_MAX_RESTARTS": "0"}
    if spec.init.method is InitMethod.file:
        path = paths.rendezvous_file(spec.init.dir)
        # With several hosts, another host's ranks may have made the file already: the launch checked
        # before any host started (runner.app.launch.stale_rendezvous_file)
        if single:
            stale_rendezvous_file(path)
        RunPaths.make_private(path.parent)
        return Rendezvous(f"file://{path}", env, file=path if node_rank == 0 else None)
    addr = plan.master_addr
    port = int(plan.master_port) if not isinstance(plan.master_port, Deferred) else 0
    store = None
    if node_rank == 0:
        store, port = _serve_store(addr, port, single, spec.init.timeout_s)
    env.update(MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True")
    return Rendezvous(plan.init_url(port), env, store=store)


def network_choice(plan: Plan, node_rank: int) -> InterfaceChoice | None:
    """The interface host ``node_rank``'s processes use to reach the others (multi-host jobs), and why."""
    if len(plan.job.hosts) < 2 or isinstance(plan.master_addr, Deferred):
        return None
    backend = plan.job.spec.backend
    if not backend.pick_interface and not backend.socket_ifname:
        return InterfaceChoice({}, "network: backend.pick_interface=false: gloo and NCCL choose their interface")
    peers = [h.reach for h in plan.job.hosts if h.index != node_rank and h.reach]
    return choose_interface(plan.master_addr, backend.socket_ifname, backend.env, os.environ, peers)


def rank_setups(plan: Plan, node_rank: int, rdzv: Rendezvous, paths: RunPaths, recipe_cfg: DictConfig,
                preflight: HostReport | None = None) -> list[RankSetup]:
    """Raises NetworkError when this host cannot reach the master. ``preflight``: this host's checks,
    for its local rank 0 to complete and print (preflight=true)."""
    job = plan.job
    setups = []
    network = network_choice(plan, node_rank)
    notes = (*rdzv.notes, *([network.note] if network else []))
    for rec in plan.host_records(node_rank):
        env = {**plan.env(rec), **rdzv.env, **(network.env if network else {})}
        if "OMP_NUM_THREADS" not in os.environ:  # as torchrun, but a share of the cores rather than 1
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // rec.local_world_size))
        setups.append(RankSetup(job.spec, recipe_settings(job.spec.recipe), recipe_cfg, rec, plan.world_size, job.backend.value, job.device,
                                rdzv.init_method, env, str(paths.root), str(paths.rank_log(rec.global_rank)),
                                str(paths.error_file(rec.global_rank)), str(paths.done_file(rec.global_rank)),
                                echo=rec.local_rank == 0, notes=notes,
                                preflight=preflight if rec.local_rank == 0 else None))
    return setups


def _preflight_host(plan: Plan, node_rank: int, paths: RunPaths) -> tuple[Rendezvous, HostReport] | int:
    """preflight=true: this host's checks, before any rank starts (runner.worker.preflight); then its part of
    the rendezvous, as in a real run. The rendezvous and the host's report so far, or the exit status
    when a check failed (its line printed)."""
    report, port = preflight.host_checks(plan, node_rank, os.environ)
    if not report.failed:
        if port is not None:  # host 0 tested this one (a free one, where the launch picks it)
            plan = dataclasses.replace(plan, master_port=str(port))
        try:
            return prepare_rendezvous(plan, node_rank, paths), report
        except RendezvousError as e:
            report = report.add(preflight.Check.failed(e.message, e.hint))
    print(report.line(), flush=True)
    return preflight.EXIT_FAILED


def _wait(context, setups: list[RankSetup]) -> tuple[object, dict[int, int]]:
    """Wait for the host's processes; the result, and the local ranks that died without a Python exception
    (a signal from outside, os._exit, a crash in C) -> exit code, seen before the launcher stops the others.

    When one of them times out in a collective, first ask those still running (not failed, not done) for
    their stacks (runner.worker.rank.STACK_SIGNAL): the report shows where the ranks that did not arrive were."""
    from runner.worker.rank import STACK_SIGNAL, is_timeout_text

    asked = False
    pids = context.pids()
    processes = getattr(getattr(context, "_pc", None), "processes", None) or []  # torch's mp.ProcessContext
    killed: dict[int, int] = {}
    while True:
        for i, proc in enumerate(processes):
            code = proc.exitcode
            if code not in (None, 0) and i not in killed and not Path(setups[i].error_file).exists() \
                    and not Path(setups[i].done_file).exists():
                killed[i] = code
        if (result := context.wait(timeout=0)) is not None:
            return result, killed
        if not asked:
            failed = [s for s in setups if Path(s.error_file).exists()]
            if any(is_timeout_text(Path(s.error_file).read_text(errors="replace")) for s in failed):
                asked = True
                for i, s in enumerate(setups):
                    if s not in failed and not Path(s.done_file).exists():
                        try:
                            os.kill(pids[i], STACK_SIGNAL)
                        except ProcessLookupError:
                            pass
        time.sleep(0.05)


def _raise_signal(signum: int, _frame: object) -> None:
    raise Interrupted(signum)


def launch_host(plan: Plan, node_rank: int, paths: RunPaths, recipe_cfg: DictConfig, announce: bool = False) -> int:
    """Run host ``node_rank``'s processes to the end, restarting them after a failure up to
    ``launcher.max_restarts`` times (one-host jobs); return the exit status for `run`. ``announce``: say
    in a line that the host's processes finished (a Slurm or MPI task, whose `run` is elsewhere; `run`
    itself ends with its summary)."""
    spec = plan.job.spec
    restarts = spec.launcher.max_restarts if len(plan.job.hosts) == 1 and not spec.preflight else 0
    while True:
        code = _launch_attempt(plan, node_rank, paths, recipe_cfg, announce)
        if code != EXIT_FAILED or paths.attempt >= restarts or StopRequest.requested:
            return code
        paths = dataclasses.replace(paths, attempt=paths.attempt + 1)
        print(f"\nrestarting: attempt {paths.attempt + 1} of {restarts + 1} (launcher.max_restarts={restarts}); "
              f"the recipe resumes from its last checkpoint", file=sys.stderr, flush=True)


def _master_unreachable(plan: Plan, node_rank: int, rdzv: Rendezvous, setups: list[RankSetup]) -> str | None:
    """On a host other than host 0 (env/tcp init): why the master's store cannot be reached, within
    init.timeout_s (host 0 may start later), naming the address, port and interface tried; None: reachable."""
    from runner.worker.network import resolve
    from runner.worker.preflight import check_reachable

    if node_rank == 0 or plan.job.spec.init.method is InitMethod.file or isinstance(plan.master_addr, Deferred):
        return None
    port = int(rdzv.env["MASTER_PORT"])
    ifname = setups[0].env.get("GLOO_SOCKET_IFNAME") if setups else None
    check = check_reachable(resolve(plan.master_addr), port, plan.job.spec.init.timeout_s, ifname)
    if check.ok:
        return None
    return f"the master {plan.master_addr}:{port} cannot be reached from this host: {check.failure}" + \
        (f"; hint: {check.hint}" if check.hint else "")


def _launch_attempt(plan: Plan, node_rank: int, paths: RunPaths, recipe_cfg: DictConfig, announce: bool) -> int:
    from torch.distributed.elastic.multiprocessing import start_processes
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from runner.worker.failures import report as failure_report
    from runner.worker.logs import RankLogs

    # the failure report below says what matters; elastic's own error dump would bury it
    for name in ("torch.distributed.elastic", "torch.multiprocessing"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    report = None  # preflight=true: this host's checks, which its local rank 0 completes
    if plan.job.spec.preflight:
        checked = _preflight_host(plan, node_rank, paths)
        if isinstance(checked, int):
            return checked
        rdzv, report = checked
    try:
        if report is None:
            rdzv = prepare_rendezvous(plan, node_rank, paths)
        setups = rank_setups(plan, node_rank, rdzv, paths, recipe_cfg, report)
    except RendezvousError as e:
        print(f"error: init: {e}", file=sys.stderr)
        return 2
    except NetworkError as e:
        print(f"error: network: {e}", file=sys.stderr)
        return 2
    unreachable = _master_unreachable(plan, node_rank, rdzv, setups) if report is None else None
    if unreachable:
        print(f"error: init: {unreachable}", file=sys.stderr)
        return EXIT_FAILED
    for s in setups:
        clear_outcome(s)
    # Not imported here, though every DDP rank imports it: torch._dynamo. Forked after that import,
    # ranks deadlocked at teardown (~ProcessGroupGloo joins a gloo thread that waits for the GIL to
    # free a Python object in its thread-local state); seen here on 1 of 31 runs, and in DESIGN.md.
    previous = {s: signal.signal(s, _raise_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    stop = stop_signal(plan.job.spec.launcher.slurm.signal)
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

    previous[stop] = signal.signal(stop, forward_stop)
    # torch.multiprocessing leaves a pytorch-errorfile-*.pickle in the temp folder for every rank that
    # raises: keep those (and the ranks' own temp files) in the run folder, and remove them after
    scratch = paths.root / "tmp"
    scratch.mkdir(exist_ok=True)
    previous_tmp, tempfile.tempdir = tempfile.tempdir, str(scratch)
    started = time.perf_counter()
    context = None
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
        result, killed = _wait(context, setups)
        context = None
        if report is not None:
            return preflight.outcome(result, setups, paths)
        return failure_report(result, setups, paths, time.perf_counter() - started, killed, announce)
    except (Interrupted, SignalException) as e:
        # ours before the processes start, elastic's (it installs its own handlers) after
        signum = e.signum if isinstance(e, Interrupted) else int(e.sigval)
        for s in (signal.SIGINT, signal.SIGTERM):  # one is enough (Ctrl-C may arrive twice, forwarded too)
            signal.signal(s, signal.SIG_IGN)
        grace = plan.job.spec.launcher.grace_s
        if signum == signal.SIGTERM and context is not None and ranks and grace > 0:
            # a polite stop (a scheduler, a shutdown): the ranks may checkpoint first (ctx.should_stop)
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
                    context = None
                    break
                time.sleep(0.05)
        print(f"\n{signal.Signals(signum).name}: stopping {len(setups)} process(es) ...", file=sys.stderr)
        return 128 + signum
    finally:
        if context is not None:
            context.close(death_sig=signal.SIGTERM, timeout=5)
        for s, handler in previous.items():
            signal.signal(s, handler)
        tempfile.tempdir = previous_tmp
        shutil.rmtree(scratch, ignore_errors=True)
        rdzv.close()
