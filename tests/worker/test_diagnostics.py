"""runner.worker.diagnostics: a dump written for each rank that cannot answer (its watch silent for SILENT_S), and
a stall diagnosed from the dumps, written into the run folder and made the attempt's failure. Made-up ranks and
clock, a real job's channel in a folder (init=file); the whole story with processes: tests/e2e/test_rank_endings.py
and test_when_a_job_hangs.py."""

from __future__ import annotations

import dataclasses
import signal

import pytest

from conftest import make_spec
from runner.records.dumps import RankDump
from runner.records.watch_files import RankWatchFiles, read_diagnosis
from runner.worker.channel import JobChannel
from runner.worker.diagnostics import SILENT_S, Diagnostics
from runner.worker.process_state import Waiting
from runner.worker.rank_life import RankLife
from test_running import running_of

pytestmark = pytest.mark.unit

NOW = 1700.0


def waits(_pid: int) -> Waiting:
    return Waiting("its main thread waits on a lock", "ProcessGroupGloo's destructor")


def test_a_rank_silent_for_silent_s_gets_a_dump_from_its_agent_on_the_channel_too(paths) -> None:
    channel = JobChannel.in_folder(paths.channel_folder(None))
    lives = {0: RankLife(started=0.0, alive=NOW - SILENT_S), 1: RankLife(started=0.0, alive=NOW - 1.0)}
    running = running_of(paths, channel=channel, lives=lives)
    Diagnostics(running, clock=lambda: NOW, waits_for=waits).speak_for_the_silent("request", NOW - 0.5)
    dump = RankWatchFiles(paths, 2).dump()
    assert dump is not None and (dump.rank, dump.host, dump.reason) == (2, "b", "request")
    assert dump.stuck == ("its watch has not run for 2 s (the GIL is held); stuck in ProcessGroupGloo's destructor: "
                          "its main thread waits on a lock")
    assert RankDump.from_document(channel.dump(2)) == dump
    assert RankWatchFiles(paths, 3).dump() is None and channel.dump(3) is None  # it answers itself


def test_a_rank_that_exited_gets_no_dump(paths) -> None:
    running = running_of(paths, lives={0: RankLife(started=0.0)})
    running.ranks[0].code = 0
    Diagnostics(running, clock=lambda: NOW, waits_for=waits).speak_for_the_silent("stop", NOW)
    assert RankWatchFiles(paths, 2).dump() is None


def test_a_stall_is_diagnosed_written_into_the_run_folder_and_the_attempts_failure(paths) -> None:
    spec = make_spec(nodes=1, devices_per_node=2)
    spec = dataclasses.replace(spec, launcher=dataclasses.replace(spec.launcher, stall_timeout_s=30.0))
    running = running_of(paths, 0, spec=spec, lives={0: RankLife(started=0.0), 1: RankLife(started=0.0)})
    asked, failure = Diagnostics(running, waits_for=waits).stall(35.0)
    assert asked > 0 and failure.stall and (failure.rank, failure.host) == (None, running.host)
    assert failure.text.startswith("stall: no rank completed a collective or a progress step for 35 s "
                                   "(launcher.stall_timeout_s=30; seen by the host agent")
    assert read_diagnosis(paths)["text"] == failure.text
    assert {RankWatchFiles(paths, r).dump().reason for r in (0, 1)} == {"stall"}  # answered for the silent


def test_where_they_were_is_nothing_once_no_rank_is_left(paths) -> None:
    running = running_of(paths)
    for rank in running.ranks:
        rank.code = -signal.SIGINT
    assert Diagnostics(running).where_they_were(signal.SIGINT) is None
