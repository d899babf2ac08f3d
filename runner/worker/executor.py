"""The one place a host agent's attempt acts: each directive its state machine returns
(runner.worker.attempt_state) carried out against the ranks' processes, the agent's stderr, the job's channel, the
diagnostics (runner.worker.diagnostics) and whoever started the agent (its reporter). An effect whose result the
attempt needs comes back as events for the machine: the failure the channel names first, the stop request as the
channel has it, the moment the ranks were asked for their dumps, a stall's diagnosis."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from runner.worker.agent_reports import AgentReport, AttemptBegan, StepReached
from runner.worker.attempt_state import (AnswerForTheSilent, AttemptState, DiagnoseStall, Directive, DumpsAnswered,
                                         Event, FirstFailureWas, ReportBegan, ReportStep, Say, SayWhereTheRanksAre,
                                         SayWhereTheyWere, Send, Stalled, StopSeen, TellFailure, TellOwnFailure,
                                         TellStop)
from runner.worker.channel_records import JobFailure
from runner.worker.diagnostics import Diagnostics
from runner.worker.failures import failure_line
from runner.worker.running import Running
from runner.worker.setup import by_rank


def say(text: str) -> None:
    """A line on the agent's stderr, at once."""
    print(text, file=sys.stderr, flush=True)


class Executor:
    """Carries out one attempt's directives (see the module docstring). ``state``: the attempt's machine, read only
    (a failure's exit status, for the line that tells the other hosts)."""

    def __init__(self, running: Running, state: AttemptState, diagnostics: Diagnostics,
                 reporter: Callable[[AgentReport], None] | None = None, *, clock: Callable[[], float] = time.time,
                 say: Callable[[str], None] = say) -> None:
        self.running = running
        self.state = state
        self.diagnostics = diagnostics
        self.reporter = reporter
        self.clock = clock
        self.say = say
        self._processes = running.by_number()
        self._effects: dict[type, Callable[[Directive], list[Event]]] = {
            Send: self._send, Say: self._say, TellOwnFailure: self._tell_own_failure, TellFailure: self._tell_failure,
            TellStop: self._tell_stop, SayWhereTheyWere: self._say_where_they_were,
            SayWhereTheRanksAre: self._say_where_the_ranks_are, AnswerForTheSilent: self._answer_for_the_silent,
            DiagnoseStall: self._diagnose_stall, ReportBegan: self._report_began, ReportStep: self._report_step}

    def carry_out(self, directive: Directive) -> list[Event]:
        """Do what ``directive`` says; the events its result makes for the machine."""
        return self._effects[type(directive)](directive)

    # -- the ranks and the terminal --------------------------------------------------------------------------------
    def _send(self, d: Send) -> list[Event]:
        for number in d.ranks:
            self._processes[number].send(d.signum, group=d.group)
        return []

    def _say(self, d: Say) -> list[Event]:
        self.say(d.text)
        return []

    # -- the job's channel -------------------------------------------------------------------------------------------
    def _tell_own_failure(self, d: TellOwnFailure) -> list[Event]:
        setup = by_rank(list(self.running.setups))[d.rank]
        failure = JobFailure(rank=d.rank, host=setup.place.host,
                             text=failure_line(setup, self.state.ending.codes[d.rank]))
        return self._tell(failure, read_back=True)

    def _tell_failure(self, d: TellFailure) -> list[Event]:
        return self._tell(d.failure, d.read_back)

    def _tell(self, failure: JobFailure, read_back: bool) -> list[Event]:
        """Put a failure on the job's channel (the other hosts end their share too, and say why); the failure the
        channel names first, where it was to be read back."""
        channel, attempt = self.running.channel, self.running.paths.attempt
        if channel is None:
            return []
        channel.say_failed(attempt, failure)
        first = channel.failure(attempt) if read_back else None
        return [FirstFailureWas(failure=first)] if first is not None else []

    def _tell_stop(self, d: TellStop) -> list[Event]:
        channel = self.running.channel
        if channel is None:
            return []
        channel.request_stop(d.signum, self.running.host)
        return [StopSeen(asked=channel.stop_requested())]

    # -- diagnostics ---------------------------------------------------------------------------------------------
    def _say_where_they_were(self, d: SayWhereTheyWere) -> list[Event]:
        said = self.diagnostics.where_they_were(d.signum)
        if said is None:
            return []
        asked, line = said
        self.say(line)
        return [DumpsAnswered(at=asked)]

    def _say_where_the_ranks_are(self, _d: SayWhereTheRanksAre) -> list[Event]:
        asked = self.diagnostics.where_the_ranks_are()
        return [DumpsAnswered(at=asked)] if asked is not None else []

    def _answer_for_the_silent(self, d: AnswerForTheSilent) -> list[Event]:
        self.diagnostics.speak_for_the_silent(d.reason, d.at)
        return []

    def _diagnose_stall(self, d: DiagnoseStall) -> list[Event]:
        asked, failure = self.diagnostics.stall(d.quiet_s)
        return [DumpsAnswered(at=asked), Stalled(failure=failure)]

    # -- whoever started the agent -----------------------------------------------------------------------------
    def _report_began(self, _d: ReportBegan) -> list[Event]:
        if self.reporter is not None:
            self.reporter(AttemptBegan(attempt=self.running.paths.attempt, at=self.clock()))
        return []

    def _report_step(self, d: ReportStep) -> list[Event]:
        if self.reporter is not None:
            seen = d.seen
            self.reporter(StepReached(attempt=self.running.paths.attempt, step=seen.step, resumed=seen.resumed,
                                      at=self.clock(), copy_host=seen.copy_host, copy_save=seen.copy_save))
        return []
