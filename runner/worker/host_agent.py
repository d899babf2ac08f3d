"""A host's share of a job, run by its host agent: the process that has the host's zygote fork its ranks
(runner.worker.zygote: a fresh interpreter that holds torch; the agent itself imports none), relays their output
(runner.worker.relay), watches their exits and their ends (runner.worker.rank_life), stops them, and says how they
ended.

The host agent is `run`'s launch agent for launcher=local and manual (runner.app.agent), and the task a scheduler
starts for launcher=slurm and mpi (runner.app.task): one per host with ``launcher.tasks=per_host``, one per rank
with ``per_device``. Its phases, named as torch elastic's agent names its own:

1. **prepare** — preflight's host checks (preflight=true), the rendezvous (host 0 serves the store for env:// and
   tcp://, as torchrun's agent does, from a process of its own: runner.worker.store_server), each rank's setup
   (runner.worker.setup);
2. **start** — fork every rank (from the zygote);
3. **monitor** — the attempt as a state machine (runner.worker.attempt_state: its phases RUNNING, STOPPING, KILLED,
   ENDED, the events that move them, one handler), until every rank has exited: a rank's exit is known at once (the
   zygote says it), whatever ended it (a return, ``sys.exit``, ``os._exit``, a signal); a rank that fails, another
   host that says its share failed (the job's channel, runner.worker.channel) or a signal to the agent starts the
   stop; a rank stuck at its end is ended, and a stall no rank's watch can see ends the attempt
   (runner.worker.rank_life); a rank that cannot say where it is gets an answer from the agent
   (runner.worker.process_state);
4. **stop** — what each cause sends the ranks, then SIGKILL to what is left of their process groups;
5. **report** — runner.worker.failures; every agent puts its ranks' records on the job's channel, and host 0's
   writes them all into its run folder (runner.worker.endings). Under mpirun, which kills every task once one has
   ended badly, the tasks end each attempt together, once host 0's has reported it (:meth:`HostAgent._end_together`).

Signals to the agent reach the ranks at once, as under torchrun: SIGINT as SIGINT; SIGTERM as SIGTERM to a
script (which may trap it) and as the stop request to a recipe (``ctx.should_stop()``: it checkpoints and
returns); the stop signal (``launcher.stop_signal``, Slurm's time-limit signal) as the stop request to a recipe
and as SIGTERM to a script (the signal scripts trap to checkpoint). Each of the three also goes on the job's
channel, so that every other host passes it on as if its own `run` had got it: one stop for the whole job. Ranks
still running ``launcher.grace_s`` after a SIGINT or SIGTERM are killed, and host 0's agent says where every rank
of every host was (their dumps, through the channel).
"""

from __future__ import annotations

import dataclasses
import os
import select
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from runner.common import exits
from runner.common.polling import poll
from runner.common.signals import StopRequest
from runner.environments.child import child_environment
from runner.environments.process import ProcessEnvironment
from runner.plan.processes import Deferred, Plan
from runner.records.outcomes import timed_out
from runner.records.paths import RunPaths
from runner.records.dumps import DUMP_WAIT_STOP_S, RankDump
from runner.records.watch_files import RankWatchFiles, clear_diagnosis, last_request, write_diagnosis
from runner.reports.hangs import diagnose, stuck_ranks
from runner.reports.where import where_the_ranks_are
from runner.spec.document import recipe_config
from runner.spec.schema import InitMethod, recipe_settings
from runner.spec.validation import console_ranks
from runner.worker.channel import ChannelError, ChannelInterrupted, JobChannel, ask_for_dumps, gather_dumps, where_through
from runner.worker.attempt_state import (AttemptState, Directive, EndedFromOutside, Event,
                                          FirstFailureWas, PeerFailed, Phase, RankExited, Say, SayWhereTheyWere, Send,
                                          Signalled, Stalled, StuckAtEnd, Tick, TellFailure, TellOwnFailure)
from runner.worker.agent_reports import AgentReport, AttemptBegan, StepReached
from runner.worker.channel_records import JobFailure, StopAsked
from runner.worker.channel_proxy import ProxyKeyValue
from runner.worker.endings import gather_endings, peer_failure, share_ended
from runner.worker.failures import agent_seen_error, failure_line, report_host_ending
from runner.worker.network import NetworkError, network_choice
from runner.worker.preflight.outcome import outcome as preflight_outcome
from runner.worker.preflight import host as preflight_host
from runner.worker.preflight.checks import Check, HostChecks
from runner.worker.process_state import what_it_waits_for
from runner.worker.rank_life import EndGuard, stalled
from runner.worker.rank_process import STACK_SIGNAL
from runner.worker.host_ending import HostEnding
from runner.worker.relay import Echo, OutputRelay, close_fds, pipes_for
from runner.worker.rendezvous import Rendezvous, RendezvousError, prepare_rendezvous
from runner.worker.setup import RankSetup, by_rank
from runner.worker.share import HostShare
from runner.worker.zygote import RankProcess, Zygote, ZygoteGone

STOP_TOLD_WAIT_S = 10.0  # how long another host's agent waits at most for host 0's to have said so, before killing
ENDINGS_WAIT_S = 15.0  # how long host 0 waits for the other hosts to say how their ranks ended
REPORTED_WAIT_S = ENDINGS_WAIT_S + 15.0  # how long another task waits for host 0's report, where tasks end together
LEFT_WAIT_S = 2.0  # ... and how long host 0's keeps its store for them to say they heard it
PEER_POLL_S = 0.5  # how often the job's channel is looked at: another host's failure, a stop request
TICK_S = 0.1  # the monitor's longest sleep while something is to be looked at
STEP_REPORT_S = 1.0  # rank 0's step is reported at most this often (its first step of an attempt at once)
SILENT_S = 2.0  # a rank whose watch has not run for this long cannot answer where it is: its agent answers for it


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


@dataclass(kw_only=True)
class _Running:
    """One attempt's ranks as the monitor watches them: their processes (in the order of their setups), setups,
    output, the job's channel, and its state (runner.worker.attempt_state); and what the monitor keeps between its
    looks."""

    ranks: list[RankProcess]
    setups: list[RankSetup]
    relay: OutputRelay
    channel: JobChannel | None
    attempt: int
    state: AttemptState
    channel_polled: float = 0.0  # when the job's channel was last looked at
    stop_seen: StopAsked | None = None  # the last stop request seen on the channel
    asked_for_stacks: bool = False  # after a collective timed out, the late ranks were asked for their stacks
    answers_checked: float = 0.0  # when the agent last answered for ranks that cannot (runner.worker.rank_life)
    guard: EndGuard = field(default_factory=EndGuard)
    step_said: int | None = None  # rank 0's step, as last reported (:attr:`HostAgent.reporter`)
    step_said_at: float = float("-inf")
    first_step_said: bool = False


class HostAgent:
    """Runs one host's share of a plan (or, for a scheduler's task per process, one rank: ``only``) to its end,
    starting it again after a failure up to ``restarts`` times. ``announce``: end with a line saying how the host's
    share ended (a Slurm or MPI task, whose `run` is elsewhere; `run` itself ends with its summary)."""

    def __init__(self, share: HostShare, *, announce: bool = False, only: int | None = None,
                 early_stop: StopRequest | None = None, zygote: Zygote | None = None,
                 reporter: Callable[[AgentReport], None] | None = None,
                 on_signal: Callable[[int], None] | None = None) -> None:
        self.plan = share.plan
        self.node_rank = share.node_rank
        self.paths = share.paths
        self.environment = share.environment
        self.announce = announce
        self.restarts = share.restarts
        self.only = only  # a task per process: this global rank alone, which serves the store itself if rank 0
        self.early_stop = early_stop  # the task's stop request, caught before this agent handles the signal
        self.reporter = reporter  # who hears its reports as it runs (runner.worker.agent_reports): launcher=ssh's `run`
        self.on_signal = on_signal  # told of each signal first, in the handler (launcher=manual: a host's leaving)
        self.signalled: int | None = None  # the first SIGINT/SIGTERM that reached the agent
        self._pending: list[int] = []
        self._ends: list[JobFailure] = []  # the job ended from outside (end_job), not yet acted on
        self._final = False  # the job ends with this attempt, whatever launcher.max_restarts allows
        self._gone: dict[str, str] = {}  # host -> why it is gone: its ranks will say nothing
        self._where_asked = False  # ask_where: say where every rank is, at the next tick
        self._wakeup: tuple[int, int] | None = None
        self._zygote = zygote  # where its ranks are forked from (runner.worker.zygote); started by run() if not given
        self._answered = 0.0  # the last request for the ranks' dumps it answered for the silent ones
        self._beats_read = 0.0  # when it last read the other hosts' ranks' heartbeats (the stall watchdog)

    # -- the whole share, attempt after attempt -------------------------------------------------------------
    def run(self) -> int:
        """The exit status for `run` (or the task). The hosts of a job start each attempt together, agreeing on it
        through the job's channel (runner.worker.channel)."""
        paths = self.paths
        stop = self.plan.rules.stop_signal
        previous = {s: signal.signal(s, self._on_signal) for s in dict.fromkeys((signal.SIGINT, signal.SIGTERM, stop))}
        # asked before the agent was ready (a task Slurm signalled early): passed on
        if self.early_stop is not None and self.early_stop.requested:
            self._pending.append(stop)
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        os.set_blocking(wake_r, False)
        self._wakeup = (wake_r, wake_w)
        previous_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        owned = self._zygote is None
        if owned:  # it imports torch while this agent prepares the rendezvous
            self._zygote = Zygote.start()
        try:
            while True:
                code, paths = self._attempt(paths)
                if code != exits.FAILED or paths.attempt >= self.restarts or self.signalled is not None or self._final:
                    return code
                paths = dataclasses.replace(paths, attempt=paths.attempt + 1)
                print(f"\nrestarting: attempt {paths.attempt + 1} of {self.restarts + 1} (launcher.max_restarts="
                      f"{self.restarts}); the recipe resumes from its last checkpoint", file=sys.stderr, flush=True)
        except ChannelInterrupted as e:  # nothing of this host had started: it ends at once
            signum = next((s for s in self._pending if s in (signal.SIGINT, signal.SIGTERM)), None)
            self.signalled = signum
            print(f"{e}: {signal.Signals(signum).name if signum else 'the job was ended'}; this host started nothing",
                  file=sys.stderr)
            return exits.from_signal(signum) if signum else exits.FAILED
        except (ChannelError, ZygoteGone) as e:
            print(f"error: {e}", file=sys.stderr)
            return exits.FAILED
        finally:
            if owned:
                self._zygote.close()
                self._zygote = None
            signal.set_wakeup_fd(previous_wakeup)
            for s, handler in previous.items():
                signal.signal(s, handler)
            os.close(wake_r)
            os.close(wake_w)
            self._wakeup = None

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self.on_signal is not None:
            self.on_signal(signum)
        self._pending.append(signum)

    def end_job(self, failure: JobFailure) -> None:
        """End the job from outside, for a cause no rank of it can see (``failure``, of no rank: another host was
        lost; launcher=ssh's `run` says so): this host's share stops as after another
        host's failure, the job's channel names the cause unless a failure came first, and nothing restarts.
        Callable from any thread."""
        self._final = True
        if failure.rank is None and failure.host:
            self._gone[failure.host] = failure.text
        self._ends.append(failure)
        self._wake()

    def ask_where(self) -> None:
        """Say where every rank of every host is, in one paragraph, asked and gathered through the job's channel
        (Ctrl-\\ to the launching `run` under launcher=ssh, which passes it to host 0's): at the attempt's next tick.
        Callable from any thread, or a signal handler."""
        self._where_asked = True
        self._wake()

    def _wake(self) -> None:
        if self._wakeup is not None:
            try:
                os.write(self._wakeup[1], b"\0")
            except OSError:
                pass

    @property
    def serves(self) -> bool:
        """This agent serves the job's store and channel: host 0's (a task per process: global rank 0's)."""
        return self.node_rank == 0 and self.only in (None, 0)

    # -- one attempt -------------------------------------------------------------------------------------------
    def _attempt(self, paths: RunPaths) -> tuple[int, RunPaths]:
        """One attempt of this host's share; its exit status, and the attempt it was (a host that joins late takes
        the one the others are in)."""
        prepared = self._prepare(paths)
        if isinstance(prepared, int):
            return prepared, paths
        rdzv, setups, report, channel, paths = prepared
        scratches = [paths.scratch(s.place.global_rank) for s in setups]  # the ranks' temp files, removed after
        for scratch in scratches:
            shutil.rmtree(scratch, ignore_errors=True)  # (an agent killed outright could not)
            scratch.mkdir(mode=0o700)
        started = time.perf_counter()
        relay = OutputRelay(sys.stdout.fileno(), sys.stderr.fileno(), bar_ok=_is_tty(sys.stdout))
        relay.start()
        ranks: list[RankProcess] = []
        try:
            self._start(setups, relay, ranks)
            self._tell_reporter(AttemptBegan(attempt=paths.attempt, at=time.time()))
            ending = self._monitor(ranks, setups, relay, channel, paths.attempt)
        finally:
            for rank in ranks:  # whatever happened above, nothing of this attempt stays behind
                rank.kill()
            relay.close()
            for scratch in scratches:
                shutil.rmtree(scratch, ignore_errors=True)
        try:
            return self._report(ending, setups, paths, report, channel, time.perf_counter() - started), paths
        finally:
            self._end_together(channel, setups, paths.attempt)
            if channel is not None:
                channel.close()
            rdzv.close()  # host 0: the store goes with the attempt (after the others said how they ended)

    def _end_together(self, channel: JobChannel | None, setups: list[RankSetup], attempt: int) -> None:
        """Under a scheduler that kills every task once one has ended badly (mpirun: the others get SIGTERM, then
        SIGKILL, a second apart), no task ends its attempt before host 0 has reported it, so that no report is cut
        short: host 0's agent says it has, the others wait for that word (or for host 0's store to go away) and say
        they heard it, and host 0's keeps its store until they have (for a moment at most)."""
        if channel is None or not self.plan.rules.tasks_end_together:
            return
        if self.serves:
            channel.say_reported(attempt)
            others = [rank for rank in self._agents() if rank != 0]
            poll(lambda: channel.left(attempt, others), lambda heard: len(heard) == len(others), LEFT_WAIT_S, TICK_S)
        elif setups:
            poll(lambda: channel.reported(attempt), bool, REPORTED_WAIT_S, TICK_S)
            channel.say_left(attempt, setups[0].place.global_rank)

    def _agents(self) -> list[int]:
        """Every agent of the job, each named by the global rank of its first rank: a host's (one per host), or each
        rank's (a task per process)."""
        if self.only is not None:
            return [rec.global_rank for rec in self.plan.records]
        return [self.plan.host_records(h.index)[0].global_rank for h in self.plan.job.hosts]

    def _prepare(self, paths: RunPaths) -> tuple[Rendezvous, list[RankSetup], HostChecks | None, JobChannel | None,
                                                 RunPaths] | int:
        """The rendezvous, the job's channel, every rank's setup (and the attempt, which a host joining late takes
        from host 0), or the exit status when the host cannot start its ranks."""
        plan, node_rank = self.plan, self.node_rank
        spec = plan.job.spec
        report = None
        if spec.preflight:
            checked = self._preflight_host(paths)
            if isinstance(checked, int):
                return checked
            rdzv, report = checked
        try:
            if report is None:
                rdzv = self._rendezvous(paths)
            setups = rank_setups(plan, node_rank, rdzv, paths, self.environment, report,
                                 terminal_is_tty=_is_tty(sys.stdout))
        except RendezvousError as e:
            print(f"error: init: {e}", file=sys.stderr)
            return exits.INVALID
        except NetworkError as e:
            print(f"error: network: {e}", file=sys.stderr)
            return exits.INVALID
        if self.only is not None:
            setups = [s for s in setups if s.place.global_rank == self.only]
        unreachable = _master_unreachable(plan, node_rank, rdzv, setups) if report is None and self.only is None \
            else None
        if unreachable:
            print(f"error: init: {unreachable}", file=sys.stderr)
            rdzv.close()
            return exits.FAILED
        channel, attempt = self._channel(rdzv, paths)
        if attempt != paths.attempt:  # a host started again joins the attempt the others are in
            paths = dataclasses.replace(paths, attempt=attempt)
            setups = [dataclasses.replace(s, paths=paths, env={**s.env, "TORCHELASTIC_RESTART_COUNT": str(attempt)})
                      for s in setups]
        for s in setups:
            s.outcome.clear()
        if self.serves:
            clear_diagnosis(paths)
        return rdzv, setups, report, channel, paths

    def _channel(self, rdzv: Rendezvous, paths: RunPaths) -> tuple[JobChannel | None, int]:
        """This agent's end of the job's channel, and the attempt to start: host 0 opens its attempt on the store
        it serves; the others reach that store and start the attempt host 0 opened (a later one than they asked
        for, when they were started again). Raises ChannelError."""
        spec = self.plan.job.spec
        if spec.init.method is InitMethod.file:
            channel = JobChannel.in_folder(paths.channel_folder(spec.init.dir))
            if self.serves:
                channel.open_attempt(paths.attempt)
            return channel, paths.attempt
        if len(self._agents()) == 1:  # the job's one agent: its ranks, its run folder and it are all there is (a
            # client of the store would cost this process torch's import, over a second of CPU beside the ranks)
            return None, paths.attempt
        if self.serves:  # the store served from host 0 (from its own process), reached over loopback as a client:
            # it listens there on one host, and on every address with several
            channel = self._reach("127.0.0.1", int(rdzv.master_port), spec.init.timeout_s)
            channel.open_attempt(paths.attempt)
            return channel, paths.attempt
        if isinstance(self.plan.master_addr, Deferred):
            return None, paths.attempt
        return JobChannel.reach_attempt(self.plan.master_addr, int(rdzv.master_port), paths.attempt,
                                        spec.init.timeout_s, reach=self._reach)

    def _reach(self, addr: str, port: int, timeout_s: float) -> JobChannel:
        """An end of the job's channel on host 0's store, through a child of the zygote (runner.worker.channel_proxy):
        the agent imports no torch. Given up (ChannelInterrupted) once this host's share is asked to stop."""
        return JobChannel(ProxyKeyValue.reach(self._zygote, addr, port, timeout_s, interrupted=self._stopping))

    def _stopping(self) -> bool:
        """Before the ranks start: SIGINT or SIGTERM reached the agent, or the job was ended from outside."""
        return self._final or any(s in (signal.SIGINT, signal.SIGTERM) for s in self._pending)

    def _rendezvous(self, paths: RunPaths) -> Rendezvous:
        """This agent's part of the rendezvous: host 0's agent (a task per process: global rank 0's) serves the store
        for every rank, as torchrun's agent does."""
        return prepare_rendezvous(self.plan, self.node_rank, paths, self._zygote, serve=self.serves,
                                  only=self.only is not None)

    def _preflight_host(self, paths: RunPaths) -> tuple[Rendezvous, HostChecks] | int:
        """preflight=true: this host's checks, before any rank starts (runner.worker.preflight); then its part of
        the rendezvous, as in a real run. The rendezvous and the host's report so far, or the exit status when a
        check failed (its line printed). A task per process: its host's first process checks the host."""
        plan = self.plan
        if self.only is not None and plan.records[self.only].local_rank != 0:
            return self._rendezvous(paths), None  # type: ignore[return-value]
        report, port = preflight_host.host_checks(plan, self.node_rank, self.environment)
        if not report.failed:
            if port is not None and self.only is None:  # host 0 tested this one (a free one, where the launch picks it)
                self.plan = plan = dataclasses.replace(plan, master_port=str(port))
            try:
                return self._rendezvous(paths), report
            except RendezvousError as e:
                report = report.add(Check.failed(e.message, e.hint))
        print(report.line(), flush=True)
        return exits.FAILED

    def _start(self, setups: list[RankSetup], relay: OutputRelay, ranks: list[RankProcess]) -> None:
        """Fork every rank from the zygote (runner.worker.rank.rank_main with its setup), appending each to ``ranks``
        as it starts; its output on new pipes the relay reads."""
        for i, setup in enumerate(setups):
            pipes, fds = pipes_for(i, str(setup.log_file), setup.echo)
            try:
                rank = self._zygote.fork(i, fds, setup)
            except ZygoteGone:
                close_fds(pipes.fds())
                raise
            finally:
                close_fds(fds)
            relay.add(pipes)
            ranks.append(rank)

    # -- while they run ----------------------------------------------------------------------------------------
    def _monitor(self, ranks: list[RankProcess], setups: list[RankSetup], relay: OutputRelay,
                 channel: JobChannel | None, attempt: int) -> HostEnding:
        """Watch the attempt's ranks until every one has ended. The attempt is a state machine
        (runner.worker.attempt_state): each look reads what happened into events (:meth:`_events`), its one handler
        takes them, and the agent carries out what it returns (:meth:`_carry_out`)."""
        launcher = self.plan.job.spec.launcher
        state = AttemptState(ranks=tuple(s.place.global_rank for s in setups),
                             scripts=bool(setups) and setups[0].runs_script, stop_signal=self.plan.rules.stop_signal,
                             grace_s=launcher.grace_s)
        running = _Running(ranks=ranks, setups=setups, relay=relay, channel=channel, attempt=attempt, state=state,
                           channel_polled=time.monotonic(),
                           stop_seen=channel.stop_requested() if channel is not None else None)  # an earlier attempt's
        while state.phase is not Phase.ENDED:
            self._wait_a_tick()
            for event in self._events(running):
                self._carry_out(state.handle(event, time.monotonic()), running)
        return state.ending

    def _events(self, a: _Running) -> Iterator[Event]:
        """What happened since the last look, as events, in the order the handler takes them; each source is read
        once the event before was handled (what is looked at depends on the phase it left)."""
        state = a.state
        for rank in a.ranks:  # the ranks whose process ended: the zygote said so
            number = a.setups[rank.index].place.global_rank
            if number not in state.ending.codes and rank.reap() is not None:
                life = a.relay.life(rank.index)  # whether it said its work returned, before its process ended
                yield RankExited(rank=number, code=rank.code, at=time.time(),
                                 returned_at=life.returned if life is not None else None)
                a.relay.drain(rank.index)
        while self._pending:
            signum = self._pending.pop(0)
            yield Signalled(signum=signum)
            self.signalled = self.signalled or state.ending.signum
            if a.channel is not None:  # Ctrl-C, SIGTERM or the stop request: every host passes it on
                a.channel.request_stop(signum, a.setups[0].place.host if a.setups else f"node {self.node_rank}")
                a.stop_seen = a.channel.stop_requested()
        if self._where_asked:
            self._where_asked = False
            self._say_where_the_ranks_are(a.ranks, a.setups, a.relay, a.channel)
        while self._ends:
            yield EndedFromOutside(failure=self._ends.pop(0))
        now = time.monotonic()
        if a.channel is not None and now - a.channel_polled >= PEER_POLL_S:
            a.channel_polled = now
            yield from self._channel_events(a)
        if not a.asked_for_stacks and state.phase is Phase.RUNNING:
            a.asked_for_stacks = self._ask_for_stacks_after_a_timeout(a.ranks, a.setups)
        if now - a.answers_checked >= PEER_POLL_S:
            a.answers_checked = now
            self._answer_for_the_silent(a.ranks, a.setups, a.relay, a.channel)
        if state.phase is Phase.RUNNING:
            yield from self._stuck_at_end(a)
        if state.phase is Phase.RUNNING and (stall := self._stall_watch(a.ranks, a.setups, a.relay, a.channel)):
            yield Stalled(failure=stall)
        self._report_rank_0s_step(a)
        yield Tick()

    def _tell_reporter(self, report: AgentReport) -> None:
        """Tell whoever started this agent and asked (:attr:`reporter`: launcher=ssh's `run`)."""
        if self.reporter is not None:
            self.reporter(report)

    def _report_rank_0s_step(self, a: _Running) -> None:
        """Rank 0's progress bar's step, where rank 0 is here: when it moved, at most every :data:`STEP_REPORT_S`
        (its first step of the attempt at once)."""
        if self.reporter is None:
            return
        rank_0 = next((r for r in a.ranks if a.setups[r.index].place.global_rank == 0), None)
        life = a.relay.life(rank_0.index) if rank_0 is not None else None
        if life is None or life.step is None or life.step == a.step_said:
            return
        now = time.monotonic()
        first = life.resumed is not None and life.step > life.resumed and not a.first_step_said
        if first or now - a.step_said_at >= STEP_REPORT_S:
            a.step_said, a.step_said_at, a.first_step_said = life.step, now, a.first_step_said or first
            self._tell_reporter(StepReached(attempt=a.attempt, step=life.step, resumed=life.resumed, at=time.time(),
                                            copy_host=life.copy_host, copy_save=life.copy_save))

    def _channel_events(self, a: _Running) -> Iterator[Event]:
        """Another host's `run` asked to stop (Ctrl-C, SIGTERM, the stop signal), or another host's rank failed."""
        asked = a.channel.stop_requested()
        if asked is not None and asked != a.stop_seen:
            a.stop_seen = asked
            yield Signalled(signum=asked.signal, origin=asked.host)
            self.signalled = self.signalled or a.state.ending.signum
        failure = a.channel.failure(a.attempt) if a.state.phase is Phase.RUNNING else None
        if failure is not None:  # end this host's share, restart together
            yield PeerFailed(failure=failure)

    def _carry_out(self, directives: list[Directive], a: _Running) -> None:
        """What the attempt's handler said to do: signals to the ranks, lines, the job's channel told."""
        processes = {a.setups[rank.index].place.global_rank: rank for rank in a.ranks}
        for directive in directives:
            if isinstance(directive, Send):
                for number in directive.ranks:
                    processes[number].send(directive.signum, group=directive.group)
            elif isinstance(directive, Say):
                print(directive.text, file=sys.stderr, flush=True)
            elif isinstance(directive, SayWhereTheyWere):
                self._say_where_they_were(a.ranks, a.setups, a.relay, directive.signum, a.channel)
            elif a.channel is not None and (first := self._tell(directive, a)) is not None:
                self._carry_out(a.state.handle(FirstFailureWas(failure=first), time.monotonic()), a)

    @staticmethod
    def _tell(directive: TellOwnFailure | TellFailure, a: _Running) -> JobFailure | None:
        """Put a failure on the job's channel (the other hosts end their share too, and say why); the failure the
        channel names first, where it was to be read back."""
        if isinstance(directive, TellOwnFailure):
            setup = by_rank(a.setups)[directive.rank]
            failure = JobFailure(rank=directive.rank, host=setup.place.host,
                                 text=failure_line(setup, a.state.ending.codes[directive.rank]))
            read_back = True
        else:
            failure, read_back = directive.failure, directive.read_back
        a.channel.say_failed(a.attempt, failure)
        return a.channel.failure(a.attempt) if read_back else None

    def _wait_a_tick(self) -> None:
        """Until the zygote says a rank ended, a signal or a message wakes the agent, or a tick has passed."""
        wake_r = self._wakeup[0] if self._wakeup else None
        try:
            select.select([self._zygote.fileno()] + ([wake_r] if wake_r is not None else []), [], [], TICK_S)
        except InterruptedError:
            pass
        if wake_r is not None:
            try:
                os.read(wake_r, 4096)
            except (BlockingIOError, OSError):
                pass

    def _say_where_the_ranks_are(self, ranks: list[RankProcess], setups: list[RankSetup], relay: OutputRelay,
                                 channel: JobChannel | None) -> None:
        """Ctrl-\\: where every rank is, asked through the job's channel; this agent answers for its silent ranks."""
        through = where_through(channel)
        ask = through["ask"]

        def ask_and_answer(paths: RunPaths, reason: str) -> float:
            asked = ask(paths, reason)
            self._speak_for_the_silent(ranks, setups, relay, channel, reason, asked)
            return asked

        where_the_ranks_are(self.plan, self.paths, ask=ask_and_answer, gather=through["gather"])

    def _stuck_at_end(self, a: _Running) -> Iterator[StuckAtEnd]:
        """The end guard (runner.worker.rank_life): a rank stuck at its end is said to be so (the handler has it
        write its stacks and kills it a moment later)."""
        ending = a.state.ending
        whole_job = len(a.setups) == self.plan.world_size  # every other rank's end is known here
        for rank in a.ranks:
            number = a.setups[rank.index].place.global_rank
            life = a.relay.life(rank.index)
            if rank.code is not None or number in ending.stuck or life is None:
                continue
            others = [r for r in a.state.ranks if r != number]
            peers = max(ending.ended_at[r] for r in others) if whole_job and others and all(
                ending.codes.get(r) == 0 for r in others) else None
            found = a.guard.look(rank.index, number, rank.pid, life, peers)
            if found is not None:
                print(f"\n{found.text} (its stacks: {a.setups[rank.index].log_file})", file=sys.stderr, flush=True)
                yield StuckAtEnd(rank=number, stuck=found)

    def _stall_watch(self, ranks: list[RankProcess], setups: list[RankSetup], relay: OutputRelay,
                     channel: JobChannel | None) -> JobFailure | None:
        """The stall watchdog from outside the ranks (runner.worker.rank_life.stalled): when no rank made progress
        for launcher.stall_timeout_s and a margin, say where the ranks are, and fail the attempt with that (as rank
        0's watch does where it can); None while they make progress."""
        timeout_s = self.plan.job.spec.launcher.stall_timeout_s
        if timeout_s is None:
            return None
        lives = {r.index: life for r in ranks if r.code is None and (life := relay.life(r.index)) is not None}
        beats: dict[int, float] = {}
        now = time.time()
        if channel is not None and len(setups) < self.plan.world_size and now - self._beats_read >= PEER_POLL_S:
            self._beats_read = now
            beats = {r: b for r in range(self.plan.world_size) if (b := channel.beat(r)) is not None}
        quiet = stalled(lives, beats, timeout_s, now)
        if quiet is None:
            return None
        asked = ask_for_dumps(self.paths, channel, "stall")
        self._speak_for_the_silent(ranks, setups, relay, channel, "stall", asked)
        dumps = gather_dumps(self.paths, channel, range(self.plan.world_size), asked, DUMP_WAIT_STOP_S)
        found = diagnose(dumps, self.plan.world_size)
        said = found.text if found else stuck_ranks(dumps)
        text = (f"stall: no rank completed a collective or a progress step for {quiet:.0f} s "
                f"(launcher.stall_timeout_s={timeout_s:g}; seen by the host agent: rank 0's watch could not say it)"
                + (f": {said}" if said else ""))
        write_diagnosis(self.paths, "stall", text, found.document() if found else None)
        host = setups[0].place.host if setups else f"node {self.node_rank}"
        return JobFailure(rank=None, host=host, text=text, stall=True)

    def _answer_for_the_silent(self, ranks: list[RankProcess], setups: list[RankSetup], relay: OutputRelay,
                               channel: JobChannel | None) -> None:
        """Where the ranks were asked where they are (Ctrl-\\, a timeout, a stop, a stall: the run folder's request
        or the channel's), the ranks here that cannot answer get an answer from their agent."""
        asked = channel.dump_request() if channel is not None else None
        request = (asked.time, asked.reason) if asked else (last_request(self.paths), "request")
        if request[0] is None or request[0] <= self._answered:
            return
        self._answered = float(request[0])
        self._speak_for_the_silent(ranks, setups, relay, channel, str(request[1] or "request"), self._answered)

    def _speak_for_the_silent(self, ranks: list[RankProcess], setups: list[RankSetup], relay: OutputRelay,
                              channel: JobChannel | None, reason: str, asked: float) -> None:
        """A dump for each running rank here whose watch has not run for :data:`SILENT_S` (the GIL is held: it cannot
        answer), saying what its threads do (runner.worker.process_state)."""
        now = time.time()
        self._answered = max(self._answered, asked)
        for rank in ranks:
            life = relay.life(rank.index) if rank.code is None else None
            if life is None or now - (life.alive if life.alive is not None else life.started) < SILENT_S:
                continue
            waits = what_it_waits_for(rank.pid)
            quiet = now - (life.alive if life.alive is not None else life.started)
            said = f"its watch has not run for {quiet:.0f} s (the GIL is held)" + (
                f"; stuck in {waits.place}" if waits.place else "") + (f": {waits.detail}" if waits.detail else "")
            place = setups[rank.index].place
            dump = RankDump(place.global_rank, place.host, now, reason, "host agent", stuck=said)
            RankWatchFiles(self.paths, place.global_rank).write_dump(dump)
            if channel is not None:
                channel.put_dump(place.global_rank, dump.document())


    def _ask_for_stacks_after_a_timeout(self, ranks: list[RankProcess], setups: list[RankSetup]) -> bool:
        """When a rank's collective timed out (its error file says so; it waits a moment before exiting), ask the
        ranks still running for their stacks (runner.worker.rank_process.STACK_SIGNAL), so that the report shows where the
        ranks it waited for were. Whether it asked."""
        failed = [s for s in setups if s.outcome.failed]
        if not any(timed_out(e) for s in failed if (e := s.outcome.error()) is not None):
            return False
        for rank, setup in zip(ranks, setups):
            if setup not in failed and not setup.outcome.done:
                rank.send(STACK_SIGNAL)
        return True

    def _say_where_they_were(self, ranks: list[RankProcess], setups: list[RankSetup], relay: OutputRelay,
                             signum: int, channel: JobChannel | None) -> None:
        """Ranks still running launcher.grace_s after a SIGINT or SIGTERM: say where they are before killing them."""
        left = [setups[r.index].place.global_rank for r in ranks if r.code is None]
        if not left:
            return
        grace = self.plan.job.spec.launcher.grace_s
        world, paths = self.plan.world_size, self.paths
        asked = ask_for_dumps(paths, channel, "stop")  # every host asks at its grace's end: the same moment
        self._speak_for_the_silent(ranks, setups, relay, channel, "stop", asked)
        if self.serves or channel is None:  # every rank of every host (the others' grace may end a little later)
            dumps = gather_dumps(paths, channel, range(world), asked, DUMP_WAIT_STOP_S)
            found = diagnose(dumps, world)
            said = found.text if found is not None else stuck_ranks(dumps)
            where = f": {said}" if said else ""
            if channel is not None:
                channel.say_stop_told(asked)
        else:  # host 0's agent says where every rank was, once (under mpirun and Slurm, in the same stream):
            gather_dumps(paths, channel, left, asked, DUMP_WAIT_STOP_S)  # its ranks answer before they are killed
            # and they are killed once it has (host 0's SIGTERM may come later on a busy machine: killing them
            # first would fail host 0's ranks in their collectives, a failure in place of the stop's story)
            poll(channel.stop_told, bool, STOP_TOLD_WAIT_S)
            where = " (host 0's agent says where every rank was)"
        print(f"{signal.Signals(signum).name}: rank(s) {', '.join(map(str, left))} still running "
              f"launcher.grace_s={grace:g} s after it; killing them{where}", file=sys.stderr, flush=True)

    # -- after ---------------------------------------------------------------------------------------------------
    def _report(self, ending: HostEnding, setups: list[RankSetup], paths: RunPaths, report: HostChecks | None,
                channel: JobChannel | None, elapsed_s: float) -> int:
        """Say how this host's share ended; its exit status. Every agent puts its ranks' records on the job's
        channel; host 0's then writes the other hosts' into its run folder (the run's summary covers every rank)."""
        placed = by_rank(setups)
        for rank, stuck in ending.stuck.items():  # the end guard's: recorded as what they were
            outcome = placed[rank].outcome
            if stuck.work_done:
                outcome.mark_ended_after_its_work(stuck.text)
            elif not outcome.failed:
                outcome.record_error(agent_seen_error(placed[rank].place, stuck.text, ending.ended_at.get(rank)))
        if channel is not None:
            share_ended(channel, paths, setups, ending)
            if self.serves and len(setups) < self.plan.world_size:
                gather_endings(channel, paths, self.plan, {s.place.global_rank for s in setups},
                               min(ENDINGS_WAIT_S, self.plan.job.spec.init.timeout_s), gone=self._gone)
        if ending.peer_failed:
            failure = ending.peer_failed
            peer_failure(paths, self.plan, failure)
            if failure.rank is not None:
                who, more = f"rank {failure.rank} on {failure.host} failed: ", "; that host's report says more"
            elif failure.stall:  # this agent's stall watchdog: the text says it all
                who, more = "", ""
            else:  # a host itself: lost, or its `run` ended (launcher=ssh says so)
                who, more = f"host {failure.host}: ", ""
            print(f"\n{who}{failure.text}\n    stopped this host's {len(setups)} process(es) "
                  f"(attempt {paths.attempt + 1}){more}", file=sys.stderr, flush=True)
            return exits.FAILED
        if ending.signum is not None:
            return exits.from_signal(ending.signum)
        if ending.earlier:
            peer_failure(paths, self.plan, ending.earlier)
        if report is not None:
            code = preflight_outcome(ending, setups, paths)
        else:
            code = report_host_ending(ending, setups, paths, elapsed_s, self.announce, channel)
        if ending.earlier:
            failure = ending.earlier
            what = f"rank {failure.rank} on {failure.host} failed" if failure.rank is not None else f"host {failure.host}"
            print(f"\nthe job's first failure, on another host: {what}: {failure.text}\n    this host's rank(s) failed "
                  f"after it", file=sys.stderr, flush=True)
        return code


def _is_tty(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError, OSError):
        return False


def launch_host(share: HostShare, zygote: Zygote | None = None) -> int:
    """Run a host's share of a plan with a :class:`HostAgent` in this process; its exit status. ``zygote``: one started
    already (else the agent starts its own)."""
    return HostAgent(share, zygote=zygote).run()
