"""One attempt of a host's share, from its ranks' start to the last one's exit: torch elastic's **start** and
**monitor** phases. Every rank is forked from the zygote (runner.worker.zygote: a fresh interpreter that holds
torch), its output relayed (runner.worker.relay); then the attempt is its state machine
(runner.worker.attempt_state): the monitor's sources are read into events (runner.worker.monitor), the machine takes
each, and the executor carries out what it returns (runner.worker.executor), until every rank has exited. Whatever
happens, nothing of the attempt stays behind: its ranks are killed and their scratch folders removed."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable

from runner.common.owned_folders import OwnedFolder
from runner.worker.agent_reports import AgentReport
from runner.worker.attempt_state import AttemptState, Directive, Event, Phase, Started
from runner.worker.diagnostics import Diagnostics
from runner.worker.executor import Executor
from runner.worker.inbox import AgentInbox
from runner.worker.monitor import Monitor, Source
from runner.worker.preparation import Prepared
from runner.worker.relay import OutputRelay, close_fds, pipes_for
from runner.worker.running import Running
from runner.worker.setup import RankSetup
from runner.worker.share import AgentRole
from runner.worker.zygote import RankProcess, Zygote, ZygoteGone


def is_tty(stream: object) -> bool:
    """Whether ``stream`` is a terminal (where a progress bar is drawn live)."""
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except (ValueError, OSError):
        return False


def run_attempt(prepared: Prepared, role: AgentRole, zygote: Zygote, inbox: AgentInbox,
                reporter: Callable[[AgentReport], None] | None = None, answered: float = 0.0) -> AttemptState:
    """Start the prepared attempt's ranks and watch them to their end; the attempt's state at its end (how its ranks
    ended: ``.ending``). ``answered``: the last request for dumps this agent answered already (in an earlier
    attempt). Raises ZygoteGone."""
    paths = prepared.paths
    scratches = [OwnedFolder.make(paths.scratch(s.place.global_rank)) for s in prepared.setups]  # removed after
    relay = OutputRelay(sys.stdout.fileno(), sys.stderr.fileno(), bar_ok=is_tty(sys.stdout))
    relay.start()
    ranks: list[RankProcess] = []
    try:
        start_ranks(zygote, prepared.setups, relay, ranks)
        running = Running(plan=prepared.plan, paths=paths, setups=prepared.setups, ranks=tuple(ranks), relay=relay,
                          channel=prepared.channel, node_rank=role.node_rank, serves=role.serves)
        setups, channel = prepared.setups, prepared.channel
        state = AttemptState(ranks=tuple(s.place.global_rank for s in setups),
                             scripts=bool(setups) and setups[0].runs_script,
                             stop_signal=prepared.plan.rules.stop_signal,
                             grace_s=prepared.plan.job.spec.launcher.grace_s,
                             stop_seen=channel.stop_requested() if channel is not None else None,  # an earlier attempt's
                             answered=answered)
        executor = Executor(running, state, Diagnostics(running), reporter)
        monitor = Monitor(running, inbox, reports_steps=reporter is not None)
        watch(state, monitor.sources(), executor.carry_out, lambda: inbox.wait(zygote.fileno()))
        return state
    finally:
        for rank in ranks:  # whatever happened above, nothing of this attempt stays behind
            rank.kill()
        relay.close()
        for scratch in scratches:
            scratch.remove()


def start_ranks(zygote: Zygote, setups: Iterable[RankSetup], relay: OutputRelay, ranks: list[RankProcess]) -> None:
    """Fork every rank from the zygote (runner.worker.rank.rank_main with its setup), appending each to ``ranks``
    as it starts; its output on new pipes the relay reads."""
    for i, setup in enumerate(setups):
        pipes, fds = pipes_for(i, str(setup.log_file), setup.echo)
        try:
            # a recipe rank holds its stop signal until it handles it (runner.worker.rank.rank_main)
            rank = zygote.fork(i, fds, setup, held_signals=() if setup.runs_script else (setup.stop_signal,))
        except ZygoteGone:
            close_fds(pipes.fds())
            raise
        finally:
            close_fds(fds)
        relay.add(pipes)
        ranks.append(rank)


def watch(state: AttemptState, sources: Iterable[Source], carry_out: Callable[[Directive], list[Event]],
          wait: Callable[[], None], clock: Callable[[], float] = time.monotonic) -> None:
    """Until the attempt has ended: wait a tick (or until a rank exits or something arrives), then read each source
    in turn, the machine taking each event and ``carry_out`` doing each directive it returns; an event a directive's
    effect makes is taken at once, before the next directive (depth first)."""
    sources = tuple(sources)

    def take(event: Event) -> None:
        for directive in state.handle(event, clock()):
            for follow in carry_out(directive):
                take(follow)

    take(Started())
    while state.phase is not Phase.ENDED:
        wait()
        for source in sources:
            for event in source(state):
                take(event)
