"""A host's share of a job, run by its host agent: the process that has the host's zygote fork its ranks
(runner.worker.zygote: a fresh interpreter that holds torch; the agent itself imports none), relays their output
(runner.worker.relay), watches their exits and their ends (runner.worker.rank_life), stops them, and says how they
ended.

The host agent is `run`'s launch agent for launcher=local and manual (runner.app.agent), and the task a scheduler
starts for launcher=slurm and mpi (runner.app.task): one per host with ``launcher.tasks=per_host``, one per rank
with ``per_device``. Its phases, named as torch elastic's agent names its own, each a module of its own; the agent
itself is the loop over attempts, and owns the one decision left to it: whether to start another.

1. **prepare** (runner.worker.preparation) — preflight's host checks (preflight=true), the rendezvous, the job's
   channel, each rank's setup: a :class:`~runner.worker.preparation.Prepared` attempt, or why it was refused;
2. **start** and 3. **monitor** (runner.worker.attempt) — fork every rank; then the attempt as a state machine
   (runner.worker.attempt_state: its phases RUNNING, STOPPING, KILLED, ENDED, the events that move them, one
   handler), until every rank has exited. The monitor's sources only read (runner.worker.monitor): a rank's exit is
   known at once (the zygote says it), whatever ended it; a signal to the agent, another host's failure or stop
   request (the job's channel, runner.worker.channel), a rank stuck at its end, a stall no rank's watch can see. The
   machine says what to do, and one executor does it (runner.worker.executor): signals, lines, the channel told,
   and the diagnostics (runner.worker.diagnostics: where the ranks are, answers for the ranks that cannot, a stall's
   diagnosis);
4. **stop** — what each cause sends the ranks, then SIGKILL to what is left of their process groups (the machine's);
5. **report** (runner.worker.attempt_report) — runner.worker.failures; every agent puts its ranks' records on the
   job's channel, and host 0's writes them all into its run folder (runner.worker.endings). Under mpirun the tasks
   end each attempt together, once host 0's has reported it.

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
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from runner.common import exits
from runner.common.owned_folders import remove_abandoned
from runner.common.signals import StopRequest, passing_on
from runner.worker.agent_reports import AgentReport, Leaving
from runner.worker.attempt import is_tty, run_attempt
from runner.worker.attempt_report import Ended, end_together, report
from runner.worker.attempt_state import AttemptState
from runner.worker.channel import ChannelError, ChannelInterrupted
from runner.worker.channel_records import JobFailure
from runner.worker.inbox import AgentInbox
from runner.worker.preparation import Preparation, Prepared, Refused, say_refused
from runner.worker.share import AgentRole, HostShare
from runner.worker.zygote import Zygote, ZygoteGone


@dataclass(frozen=True)
class Finished:
    """How the agent's share ended: its exit status, and the SIGINT or SIGTERM that ended it (None: none did)."""

    code: int
    signum: int | None = None


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
        self.role = AgentRole(node_rank=share.node_rank, only=only)
        self.early_stop = early_stop  # the task's stop request, caught before this agent handles the signal
        self.reporter = reporter  # who hears its reports as it runs (runner.worker.agent_reports): launcher=ssh's `run`
        self.on_signal = on_signal  # told of each signal first, in the handler (launcher=manual: a host's leaving)
        self.inbox = AgentInbox()  # what reaches it from outside: signals, the job's end, Ctrl-\
        self._zygote = zygote  # where its ranks are forked from (runner.worker.zygote); started by run() if not given
        self._finished: Finished | None = None

    @property
    def serves(self) -> bool:
        """This agent serves the job's store and channel: host 0's (a task per process: global rank 0's)."""
        return self.role.serves

    @property
    def signalled(self) -> int | None:
        """The SIGINT or SIGTERM (to this agent, or another host's `run`) that ended the share; None: none did (or
        it has not ended)."""
        return self._finished.signum if self._finished is not None else None

    # -- the whole share, attempt after attempt -------------------------------------------------------------
    def run(self) -> int:
        """The exit status for `run` (or the task). The hosts of a job start each attempt together, agreeing on it
        through the job's channel (runner.worker.channel)."""
        stop = self.plan.rules.stop_signal
        if self.early_stop is not None and self.early_stop.requested:  # asked before the agent was ready (a task
            self.inbox.signalled(stop)  # Slurm signalled early): passed on
        owned = self._zygote is None
        with passing_on(stop, self._on_signal), self.inbox.waking():
            zygote = self._zygote if self._zygote is not None else Zygote.start()  # it imports torch meanwhile
            remove_abandoned()  # scratch folders of agents killed outright on this machine (they could not)
            try:
                self._finished = self._attempts(zygote)
            finally:
                if owned:
                    zygote.close()
        return self._finished.code

    def _attempts(self, zygote: Zygote) -> Finished:
        """Attempt after attempt, until one ends other than by a failure, the restarts are spent, a signal ended it,
        or the job was ended from outside. The plan (which preflight may give a port) and the run folder's attempt
        go from one attempt to the next, as values."""
        plan, paths, answered = self.plan, self.paths, 0.0
        preparation = Preparation(role=self.role, environment=self.environment, zygote=zygote,
                                  stopping=self.inbox.stopping, terminal_is_tty=is_tty(sys.stdout))
        try:
            while True:
                prepared = preparation.prepare(plan, paths)
                if isinstance(prepared, Refused):
                    say_refused(prepared)
                    if prepared.leaving is not None and self.reporter is not None:  # named by the data-network check
                        self.reporter(Leaving(at=time.time(), why=prepared.leaving, host=self.node_rank,
                                              preempted=False))
                    return Finished(prepared.code)
                state, code = self._attempt(prepared, zygote, answered)
                plan, paths, answered, signum = prepared.plan, prepared.paths, state.answered, state.ending.signum
                if code != exits.FAILED or paths.attempt >= self.restarts or signum is not None or self.inbox.ended:
                    return Finished(code, signum)
                paths = dataclasses.replace(paths, attempt=paths.attempt + 1)
                print(f"\nrestarting: attempt {paths.attempt + 1} of {self.restarts + 1} (launcher.max_restarts="
                      f"{self.restarts}); the recipe resumes from its last checkpoint", file=sys.stderr, flush=True)
        except ChannelInterrupted as e:  # nothing of this host had started: it ends at once
            signum = self.inbox.first_stop()
            print(f"{e}: {signal.Signals(signum).name if signum else 'the job was ended'}; this host started nothing",
                  file=sys.stderr)
            return Finished(exits.from_signal(signum) if signum else exits.FAILED, signum)
        except (ChannelError, ZygoteGone) as e:
            print(f"error: {e}", file=sys.stderr)
            return Finished(exits.FAILED, self.inbox.first_stop())

    def _attempt(self, prepared: Prepared, zygote: Zygote, answered: float) -> tuple[AttemptState, int]:
        """One prepared attempt, run and reported: its state at its end, and its exit status."""
        started = time.perf_counter()
        state = run_attempt(prepared, self.role, zygote, self.inbox, self.reporter, answered)
        ended = Ended(ending=state.ending, plan=prepared.plan, paths=prepared.paths, setups=prepared.setups,
                      report=prepared.report, channel=prepared.channel, elapsed_s=time.perf_counter() - started)
        try:
            return state, report(ended, self.role, announce=self.announce, gone=self.inbox.gone())
        finally:
            end_together(ended, self.role)
            if prepared.channel is not None:
                prepared.channel.close()
            prepared.rdzv.close()  # host 0: the store goes with the attempt (after the others said how they ended)

    # -- from outside ------------------------------------------------------------------------------------------
    def _on_signal(self, signum: int) -> None:
        if self.on_signal is not None:
            self.on_signal(signum)
        self.inbox.signalled(signum)

    def end_job(self, failure: JobFailure) -> None:
        """End the job from outside, for a cause no rank of it can see (``failure``, of no rank: another host was
        lost; launcher=ssh's `run` says so): this host's share stops as after another host's failure, the job's
        channel names the cause unless a failure came first, and nothing restarts. Callable from any thread."""
        self.inbox.end(failure)

    def stop_ranks(self) -> None:
        """Ask every rank of the job to stop at its next checkpoint, as the stop signal to `run` does (a recipe's ranks
        save and return; a script's get SIGTERM): launcher=manual's host 0, for hosts that join there. Callable from
        any thread."""
        self.inbox.signalled(self.plan.rules.stop_signal)
        self.inbox.wake()

    def ask_where(self) -> None:
        """Say where every rank of every host is, in one paragraph, asked and gathered through the job's channel
        (Ctrl-\\ to the launching `run` under launcher=ssh, which passes it to host 0's): at the attempt's next tick.
        Callable from any thread, or a signal handler."""
        self.inbox.ask_where()


def launch_host(share: HostShare, zygote: Zygote | None = None) -> int:
    """Run a host's share of a plan with a :class:`HostAgent` in this process; its exit status. ``zygote``: one started
    already (else the agent starts its own)."""
    return HostAgent(share, zygote=zygote).run()
