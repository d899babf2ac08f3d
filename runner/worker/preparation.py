"""A host agent's first phase of each attempt, as torch elastic's agent names it: **prepare**. Preflight's host
checks (preflight=true), the rendezvous (host 0 serves the store for env:// and tcp://, as torchrun's agent does,
from a process of its own: runner.worker.store_server), the job's channel (runner.worker.channel) and each rank's
setup (runner.worker.setup).

What comes out is a value: :class:`Prepared` (the plan the attempt runs, which preflight may have given the port it
tested, and the attempt a host joining late takes from host 0), or :class:`Refused` (the exit status and the line
that says why). The agent's loop carries the prepared plan to its next attempt; nothing here changes the agent.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from dataclasses import dataclass

from runner.common import exits
from runner.common.formatting import rank_list
from runner.environments.child import child_environment
from runner.environments.process import ProcessEnvironment
from runner.plan.processes import Deferred, Plan
from runner.records.paths import RunPaths
from runner.records.watch_files import clear_diagnosis
from runner.spec.document import recipe_config
from runner.spec.schema import InitMethod, recipe_settings
from runner.spec.validation import console_ranks
from runner.worker.channel import JobChannel
from runner.worker.channel_proxy import ProxyKeyValue
from runner.worker import hung_hosts
from runner.worker.failures import NOT_ARRIVED_HINT
from runner.worker.network import NetworkError, network_choice
from runner.worker.pair_check import Absent, PairBoard, check_pairs, data_address
from runner.worker.preflight import host as preflight_host
from runner.worker.preflight.checks import Check, HostChecks
from runner.worker.relay import Echo
from runner.worker.rendezvous import Rendezvous, RendezvousError, prepare_rendezvous
from runner.worker.setup import RankSetup
from runner.worker.share import AgentRole
from runner.worker.zygote import Zygote


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """One attempt, ready to start: its plan, rendezvous, every rank's setup (this agent's), this host's preflight
    report (preflight=true), its end of the job's channel (None: a job of one agent, or one whose master is not known
    here), and its run folder at the attempt the hosts agreed on."""

    plan: Plan
    rdzv: Rendezvous
    setups: tuple[RankSetup, ...]
    report: HostChecks | None
    channel: JobChannel | None
    paths: RunPaths


@dataclass(frozen=True, kw_only=True)
class Refused:
    """The host cannot start its ranks: the exit status, and the line that says why (on stdout: preflight's report
    line; else on stderr)."""

    code: int
    line: str
    stdout: bool = False
    leaving: str | None = None  # this host is the one the data-network check named: why it leaves the job


@dataclass(frozen=True, kw_only=True)
class Preparation:
    """What an agent prepares each attempt with: its role in the job, its environment, its zygote (the store and the
    channel's client are its children), and whether it is asked to stop (reaching host 0's store is given up then)."""

    role: AgentRole
    environment: ProcessEnvironment
    zygote: Zygote
    stopping: Callable[[], bool]
    terminal_is_tty: bool = False

    def prepare(self, plan: Plan, paths: RunPaths) -> Prepared | Refused:
        """The rendezvous, the job's channel, every rank's setup (and the attempt, which a host joining late takes
        from host 0), or why the host cannot start its ranks. Raises ChannelError (ChannelInterrupted: asked to
        stop while reaching host 0's store)."""
        report, rdzv = None, None
        if plan.job.spec.preflight:
            checked = self._preflight_host(plan, paths)
            if isinstance(checked, Refused):
                return checked
            plan, rdzv, report = checked
        try:
            if rdzv is None:
                rdzv = self._rendezvous(plan, paths)
            setups = rank_setups(plan, self.role.node_rank, rdzv, paths, self.environment, report,
                                 terminal_is_tty=self.terminal_is_tty)
        except RendezvousError as e:
            return Refused(code=exits.INVALID, line=f"error: init: {e}")
        except NetworkError as e:
            return Refused(code=exits.INVALID, line=f"error: network: {e}")
        only = self.role.only
        if only is not None:
            setups = [s for s in setups if s.place.global_rank == only]
        unreachable = master_unreachable(plan, self.role.node_rank, rdzv, setups) \
            if report is None and only is None else None
        if unreachable:
            rdzv.close()
            return Refused(code=exits.FAILED, line=f"error: init: {unreachable}")
        channel, attempt = self._channel(plan, rdzv, paths)
        if attempt != paths.attempt:  # a host started again joins the attempt the others are in
            paths = dataclasses.replace(paths, attempt=attempt)
            setups = [dataclasses.replace(s, paths=paths, env={**s.env, "TORCHELASTIC_RESTART_COUNT": str(attempt)})
                      for s in setups]
        named = self._check_pairs(plan, channel, paths, setups)
        if named is not None:
            if channel is not None:
                channel.close()
            rdzv.close()
            return named
        for s in setups:
            s.outcome.clear()
        if self.role.serves:
            clear_diagnosis(paths)
        return Prepared(plan=plan, rdzv=rdzv, setups=tuple(setups), report=report, channel=channel, paths=paths)

    def _preflight_host(self, plan: Plan, paths: RunPaths) -> tuple[Plan, Rendezvous, HostChecks | None] | Refused:
        """preflight=true: this host's checks, before any rank starts (runner.worker.preflight); then its part of
        the rendezvous, as in a real run. The plan (host 0's with the port its checks tested), the rendezvous and the
        host's report so far, or the failed check's line. A task per process: its host's first process checks the
        host."""
        only = self.role.only
        if only is not None and plan.records[only].local_rank != 0:
            return plan, self._rendezvous(plan, paths), None
        report, port = preflight_host.host_checks(plan, self.role.node_rank, self.environment)
        if not report.failed:
            if port is not None and only is None:  # host 0 tested this one (a free one, where the launch picks it)
                plan = dataclasses.replace(plan, master_port=str(port))
            try:
                return plan, self._rendezvous(plan, paths), report
            except RendezvousError as e:
                report = report.add(Check.failed(e.message, e.hint))
        return Refused(code=exits.FAILED, line=report.line(), stdout=True)

    def _check_pairs(self, plan: Plan, channel: JobChannel | None, paths: RunPaths,
                     setups: list[RankSetup]) -> Refused | None:
        """The data-network check of every pair of hosts (runner.worker.pair_check), where the job has several hosts
        that meet through host 0's store: the attempt refused where it names a host (``leaving`` on that host), else
        None."""
        spec, hosts = plan.job.spec, plan.job.hosts
        if channel is None or len(hosts) < 2 or self.role.only is not None or spec.backend.pair_check_s <= 0 \
                or spec.init.method is InitMethod.file or isinstance(plan.master_addr, Deferred):
            return None
        addr, no_addr = None, ""
        try:
            addr = data_address(setups[0].env if setups else {}, plan.master_addr)
        except NetworkError as e:
            no_addr = e.message
        labels = [h.label for h in hosts]
        hung = None
        if self.role.serves:  # host 0's agent, the one that makes the verdict
            hung_hosts.note(paths)
            hung = hung_hosts.named(hung_hosts.hangs(paths), paths.attempt, labels)
        board = PairBoard(put=channel.say_pairs, get=channel.pairs, stopping=self.stopping)
        found = check_pairs(board, paths.attempt, self.role.node_rank, len(hosts), addr,
                            token=f"{paths.run_id}/{paths.attempt}", timeout_s=spec.backend.pair_check_s,
                            gather_s=spec.init.timeout_s, no_addr=no_addr, hung=hung)
        if isinstance(found, Absent):
            return Refused(code=exits.FAILED, line=absent_line(plan, found, paths.attempt))
        if found is None or found.named is None:
            return None
        why = found.why(labels, paths.attempt)
        hint = hung_hosts.HINT if found.hung else ("check that host's data interface and routes (ip -br addr; ip "
                                                   "route get <a peer's address>), and any firewall between the hosts "
                                                   "(the backend dials ephemeral ports)")
        return Refused(code=exits.FAILED, line=f"error: {'hang' if found.hung else 'network'}: {why}; hint: {hint}",
                       leaving=why if found.named == self.role.node_rank else None)

    def _rendezvous(self, plan: Plan, paths: RunPaths) -> Rendezvous:
        """This agent's part of the rendezvous: host 0's agent (a task per process: global rank 0's) serves the store
        for every rank, as torchrun's agent does."""
        return prepare_rendezvous(plan, self.role.node_rank, paths, self.zygote, serve=self.role.serves,
                                  only=self.role.only is not None)

    def _channel(self, plan: Plan, rdzv: Rendezvous, paths: RunPaths) -> tuple[JobChannel | None, int]:
        """This agent's end of the job's channel, and the attempt to start: host 0 opens its attempt on the store
        it serves; the others reach that store and start the attempt host 0 opened (a later one than they asked
        for, when they were started again). Raises ChannelError."""
        spec = plan.job.spec
        if spec.init.method is InitMethod.file:
            channel = JobChannel.in_folder(paths.channel_folder(spec.init.dir))
            if self.role.serves:
                channel.open_attempt(paths.attempt)
            return channel, paths.attempt
        if len(self.role.agents(plan)) == 1:  # the job's one agent: its ranks, its run folder and it are all there
            # is (a client of the store would cost this process torch's import, over a second of CPU beside the ranks)
            return None, paths.attempt
        if self.role.serves:  # the store served from host 0 (from its own process), reached over loopback as a
            # client: it listens there on one host, and on every address with several
            channel = self._reach("127.0.0.1", int(rdzv.master_port), spec.init.timeout_s)
            channel.open_attempt(paths.attempt)
            return channel, paths.attempt
        if isinstance(plan.master_addr, Deferred):
            return None, paths.attempt
        return JobChannel.reach_attempt(plan.master_addr, int(rdzv.master_port), paths.attempt,
                                        spec.init.timeout_s, reach=self._reach)

    def _reach(self, addr: str, port: int, timeout_s: float) -> JobChannel:
        """An end of the job's channel on host 0's store, through a child of the zygote (runner.worker.channel_proxy):
        the agent imports no torch. Given up (ChannelInterrupted) once this host's share is asked to stop."""
        return JobChannel(ProxyKeyValue.reach(self.zygote, addr, port, timeout_s, interrupted=self.stopping))


def absent_line(plan: Plan, absent: Absent, attempt: int) -> str:
    """Why an attempt is refused where hosts never came to the data-network check (within init.timeout_s): which,
    with their ranks, and what to look at."""
    hosts = ", ".join(f"{n} ({plan.job.hosts[n].label})" for n in absent.nodes)
    ranks = [r.global_rank for n in absent.nodes for r in plan.host_records(n)]
    return (f"error: init: host(s) {hosts} did not come within init.timeout_s={plan.job.spec.init.timeout_s:g} s: "
            f"rank(s) {rank_list(ranks, 12)} never started (before attempt {attempt + 1}, host 0's store heard "
            f"nothing of their agent)\n{NOT_ARRIVED_HINT}")


def say_refused(refused: Refused) -> None:
    """The refusal's line, where it goes."""
    if refused.stdout:
        print(refused.line, flush=True)
    else:
        print(refused.line, file=sys.stderr)


def rank_setups(plan: Plan, node_rank: int, rdzv: Rendezvous, paths: RunPaths, environment: ProcessEnvironment,
                preflight: HostChecks | None = None, terminal_is_tty: bool = False) -> list[RankSetup]:
    """Every rank of host ``node_rank``. Raises NetworkError when this host cannot reach the master. ``preflight``:
    this host's checks, for its local rank 0 to complete and print (preflight=true); ``terminal_is_tty``: the
    agent's stdout is a terminal, where rank 0's progress bar is drawn live (log.console=main)."""
    job = plan.job
    setups = []
    network = network_choice(plan, node_rank, environment)
    notes = (*rdzv.notes, *([network.note] if network else []))
    recipe_cfg = recipe_config(job.spec.recipe)  # the same for every rank, under every launcher
    console = str(job.spec.log.console)
    chosen = console_ranks(console) or ()
    for rec in plan.host_records(node_rank):
        if console == "main":
            echo = Echo(shown=rec.local_rank == 0, progress=rec.global_rank == 0,
                        live_bar=rec.global_rank == 0 and terminal_is_tty)
        else:
            shown = console == "all" or rec.global_rank in chosen
            echo = Echo(shown=shown, prefix=f"[rank {rec.global_rank} {rec.host}] " if shown else "", progress=shown)
        env = child_environment(plan, rec, paths, environment, master_port=rdzv.master_port,
                                agent_store=rdzv.agent_store, network=network.env if network else {},
                                tmpdir=str(paths.scratch(rec.global_rank)))
        setups.append(RankSetup(spec=job.spec, recipe=recipe_settings(job.spec.recipe), recipe_cfg=recipe_cfg, place=rec,
                                backend=job.backend.value, device=job.device,
                                init_method=rdzv.init_method, env=env, paths=paths, stop_signal=plan.rules.stop_signal,
                                echo=echo, notes=notes, preflight=preflight if rec.local_rank == 0 else None))
    return setups


def master_unreachable(plan: Plan, node_rank: int, rdzv: Rendezvous, setups: list[RankSetup]) -> str | None:
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
