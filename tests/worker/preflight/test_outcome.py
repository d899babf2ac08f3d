"""runner.worker.preflight.outcome: how a host's preflight ended, from its ranks' records and exit statuses, as its
agent says it (the reporting process's line first, the others counted)."""

from __future__ import annotations

import pytest

from runner.worker.host_ending import HostEnding
from runner.worker.preflight.outcome import outcome
from test_collective import raised, setups_of

pytestmark = pytest.mark.unit


def test_a_host_whose_processes_all_passed_exits_0_and_says_nothing_more(paths, capsys) -> None:
    setups = setups_of(paths, 2, "env://")
    assert outcome(HostEnding(codes={0: 0, 1: 0}, order=[1, 0]), setups, paths) == 0
    assert capsys.readouterr() == ("", "")


REPORTING = "preflight node0 (tb1): 2 CPU process(es) as the spec says · FAILED: no route"  # local rank 0's line


@pytest.mark.parametrize("processes, records, codes, shown, also", [
    # the reporting process's line comes first, even when another process failed before it
    (2, {1: ("preflight node0 rank 1: FAILED: gloo all-reduce over 2 process(es): early", 100.0),
         0: (REPORTING, 200.0)},
     {0: 1, 1: 1}, REPORTING, " (1 other process(es) of this host failed or were stopped)"),
    # without it, the earliest failure; a process the agent stopped counts among the others
    (4, {3: ("preflight node0 rank 3: FAILED: second", 200.0), 2: ("preflight node0 rank 2: FAILED: first", 100.0)},
     {0: -15, 1: 0, 2: 1, 3: 1}, "preflight node0 rank 2: FAILED: first",
     " (2 other process(es) of this host failed or were stopped)"),
    # the only failure: no other process to count
    (2, {0: (REPORTING, 100.0)}, {0: 1, 1: 0}, REPORTING, ""),
], ids=["reporting-first", "earliest", "alone"])
def test_a_failed_preflight_shows_one_processs_line_then_the_others_count_and_exits_1(
        paths, capsys, processes, records, codes, shown, also) -> None:
    setups = setups_of(paths, processes, "env://")
    for index, (line, at) in records.items():
        raised(setups[index], line, at)
    assert outcome(HostEnding(codes=codes, order=list(codes)), setups, paths) == 1
    assert capsys.readouterr().err == f"{shown}\npreflight failed on node0{also}; per-rank logs: {paths.logs}/\n"


def test_a_failed_preflight_without_any_processs_line_counts_its_processes_not_others(paths, capsys) -> None:
    setups = setups_of(paths, 2, "env://")
    assert outcome(HostEnding(codes={0: -9, 1: 0}, order=[0, 1]), setups, paths) == 1
    assert capsys.readouterr().err == (f"preflight failed on node0 (1 process(es) of this host failed or were stopped); "
                                       f"per-rank logs: {paths.logs}/\n")
