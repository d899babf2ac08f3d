"""runner.worker.attempt, the watch loop without processes: the machine takes each source's events in turn, every
directive is carried out, and an effect's events are taken at once, before the next directive; the loop ends when
every rank has exited. Whole attempts with real ranks: tests/launchers/test_local_launcher.py, tests/e2e."""

from __future__ import annotations

import io
import signal

import pytest

from runner.worker.attempt import is_tty, watch
from runner.worker.attempt_state import (AttemptState, Directive, Event, FirstFailureWas, Phase, RankExited,
                                         ReportBegan, Send, Tick, TellOwnFailure)
from runner.worker.channel_records import JobFailure

pytestmark = pytest.mark.unit

EARLIER = JobFailure(rank=0, host="a", text="RuntimeError: boom", time=1.0)


def test_the_loop_takes_events_in_order_carries_out_each_directive_and_feeds_back_depth_first() -> None:
    state = AttemptState(ranks=(2, 3), scripts=False, stop_signal=signal.SIGUSR1, grace_s=1.0)
    looks = iter([[RankExited(rank=3, code=1, at=5.0)], [RankExited(rank=2, code=-signal.SIGTERM, at=6.0)]])
    done: list[Directive] = []

    def carry_out(directive: Directive) -> list[Event]:
        done.append(directive)
        return [FirstFailureWas(failure=EARLIER)] if isinstance(directive, TellOwnFailure) else []

    waits: list[int] = []
    watch(state, [lambda _state: next(looks), lambda _state: [Tick()]], carry_out, lambda: waits.append(1),
          clock=lambda: 100.0)
    assert done == [ReportBegan(), TellOwnFailure(rank=3), Send(signum=signal.SIGTERM, ranks=(2,))]
    assert state.ending.earlier == EARLIER  # taken before the SIGTERM was sent
    assert state.phase is Phase.ENDED and len(waits) == 2


def test_an_attempt_with_no_ranks_reports_its_start_and_ends_without_a_look() -> None:
    state = AttemptState(ranks=(), scripts=False, stop_signal=signal.SIGUSR1, grace_s=1.0)
    done: list[Directive] = []
    watch(state, [lambda _state: pytest.fail("looked")], lambda d: done.append(d) or [], lambda: None)
    assert done == [ReportBegan()]


def test_a_progress_bar_is_drawn_live_on_a_terminal_only() -> None:
    assert not is_tty(io.StringIO()) and not is_tty(object())
