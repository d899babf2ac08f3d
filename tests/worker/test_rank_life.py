"""runner.worker.rank_life: what a rank's events tell its agent, the end guard's verdict on a rank stuck at its end,
and the stall watchdog from outside the ranks (a made-up clock, CPU time and /proc: the whole runs are in
tests/e2e/test_rank_endings.py)."""

from __future__ import annotations

import pytest

from clocks import Clock
from runner.worker.process_state import Waiting
from runner.worker.rank_life import QUIET_S, STALL_MARGIN_S, EndGuard, RankLife, stalled

pytestmark = pytest.mark.unit

JOINING = Waiting("its main thread waits for its thread pt_gloo_runloop to end, which waits on a lock",
                  "ProcessGroupGloo's destructor")


def test_a_ranks_events_are_its_life() -> None:
    life = RankLife(started=100.0)
    life.heard({"k": "life", "event": "joined"}, 101.0)
    life.heard({"k": "alive", "progressed": 101.5}, 102.0)
    assert (life.joined, life.alive, life.progressed, life.work_over()) == (101.0, 102.0, 101.5, None)
    assert (life.step, life.resumed) == (None, None)  # no progress bar yet
    life.heard({"k": "alive", "progressed": 101.7, "step": 33, "resumed": 30}, 102.5)
    assert (life.step, life.resumed, life.progressed) == (33, 30, 101.7)
    life.heard({"k": "copy", "host": "b", "seq": 4, "step": 30}, 102.6)  # rank 0 resumes from host b's copy
    assert (life.copy_host, life.copy_save) == ("b", 4)
    life.heard({"k": "life", "event": "destroyed"}, 102.1)
    life.heard({"k": "life", "event": "returned"}, 102.2)
    life.heard({"k": "life", "event": "anything else"}, 103.0)
    assert life.work_over() == "destroyed its process group at 2.1 s"
    assert RankLife(started=0.0, returned=3.25).work_over() == "returned at 3.2 s"


class Process:
    """A rank's process as the guard reads it: its main thread's CPU time."""

    def __init__(self) -> None:
        self.cpu = 1.0

    def __call__(self, pid: int) -> float:
        return self.cpu


def guard_of(clock: Clock, process: Process) -> EndGuard:
    return EndGuard(clock=clock, cpu=process, waits_for=lambda pid: JOINING)


def test_a_rank_whose_work_is_over_and_that_does_nothing_for_quiet_s_is_stuck_and_its_result_stands() -> None:
    clock, process = Clock(100.0), Process()
    guard = guard_of(clock, process)
    life = RankLife(started=98.0, destroyed=100.1, alive=100.0)
    assert guard.look(1, 1, 42, life, None) is None  # the first look only starts the watch
    clock.sleep(QUIET_S - 0.5)
    assert guard.look(1, 1, 42, life, None) is None
    clock.sleep(1.0)
    stuck = guard.look(1, 1, 42, life, None)
    assert stuck is not None and stuck.work_done and stuck.index == 1
    assert stuck.text == ("rank 1 destroyed its process group at 2.1 s and did not end (stuck in ProcessGroupGloo's "
                          "destructor: its main thread waits for its thread pt_gloo_runloop to end, which waits on a "
                          "lock; its main thread used no CPU time for 10 s, and its watch could not run: the GIL is "
                          "held); ended it")


def test_a_rank_that_uses_cpu_or_whose_watch_runs_is_doing_something_of_its_own() -> None:
    clock, process = Clock(100.0), Process()
    guard = guard_of(clock, process)
    life = RankLife(started=98.0, destroyed=100.1)
    guard.look(0, 0, 42, life, None)
    for _ in range(5):  # its main thread works: never stuck
        clock.sleep(QUIET_S)
        process.cpu += 0.5
        assert guard.look(0, 0, 42, life, None) is None
    for _ in range(5):  # its watch runs (a sleep, input, a file: the GIL is free): never stuck
        clock.sleep(QUIET_S)
        life.alive = clock.now - 0.5
        assert guard.look(0, 0, 42, life, None) is None


def test_a_rank_whose_work_is_not_over_is_never_stuck_at_its_end() -> None:
    clock, process = Clock(100.0), Process()
    guard = guard_of(clock, process)
    life = RankLife(started=98.0, joined=99.0)
    for _ in range(5):
        clock.sleep(QUIET_S)
        assert guard.look(0, 0, 42, life, None) is None


def test_a_rank_still_there_after_every_other_rank_ended_is_stuck_but_its_work_is_not_known_done() -> None:
    clock, process = Clock(100.0), Process()
    guard = guard_of(clock, process)
    life = RankLife(started=90.0, joined=91.0)
    guard.look(2, 2, 42, life, peers_ended_at=99.0)
    clock.sleep(QUIET_S)
    stuck = guard.look(2, 2, 42, life, peers_ended_at=99.0)
    assert stuck is not None and not stuck.work_done
    assert stuck.text.startswith("rank 2 was still running 11 s after every other rank had ended without ending")


def test_the_stall_watchdog_counts_from_the_last_progress_or_the_join_and_waits_a_margin_past_the_timeout() -> None:
    lives = {0: RankLife(started=0.0, joined=10.0, progressed=20.0), 1: RankLife(started=0.0, joined=11.0)}
    limit = 30.0 + STALL_MARGIN_S
    assert stalled(lives, {}, None, 1000.0) is None  # no stall_timeout_s
    assert stalled({0: RankLife(started=0.0)}, {}, 30.0, 1000.0) is None  # no group formed yet: init.timeout_s's
    assert stalled(lives, {}, 30.0, 20.0 + limit - 0.1) is None
    assert stalled(lives, {}, 30.0, 20.0 + limit) == pytest.approx(limit)
    assert stalled(lives, {5: 40.0}, 30.0, 20.0 + limit) is None  # another host's rank made progress since
