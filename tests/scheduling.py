"""The order in which the suite's files reach pytest-xdist's workers: the longest first.

scripts/test.sh runs the files on several workers, a whole file on one worker (``--dist loadfile``: its module
fixtures made once), each worker taking the next file as it finishes one. On a machine whose cores the suite keeps
busy, the wall time is set by the last file to finish: handing out the longest files first (and the short ones as
fillers at the end) keeps every worker busy to the end. How long each file takes is measured, not guessed:
``tests/durations.json`` holds the seconds each file took in a full run, written by
``bash scripts/test.sh --record-durations tests/durations.json`` (all phases of every test: setup, call, teardown).
A file it does not list goes first (a new file is as likely to be long as short). The order changes nothing but the
wall time: each file's tests keep the order they are written in.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).parent / "durations.json"


def recorded_durations(path: Path = DURATIONS) -> dict[str, float]:
    """Seconds per test file (its path from the repository's root, as pytest names it); {} without the file."""
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except FileNotFoundError:
        return {}


def longest_first(items: list[pytest.Item], seconds: dict[str, float]) -> list[pytest.Item]:
    """``items`` with their files in decreasing order of ``seconds`` (unlisted files first), each file's items in
    their own order."""
    position = {}
    for item in items:
        position.setdefault(item.nodeid.split("::")[0], len(position))
    unlisted = float("inf")
    return sorted(items, key=lambda item: (-seconds.get(file := item.nodeid.split("::")[0], unlisted), position[file]))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--record-durations", metavar="PATH", default=None,
                     help="write the seconds each test file took (all phases) to PATH as JSON (tests/durations.json "
                          "orders the files for pytest-xdist: tests/scheduling.py)")


def reference_loop_s(rounds: int = 3) -> float:
    """Seconds this machine takes for a reference loop of plain Python (10**6 additions), the best of ``rounds``:
    the suite's times scale with it, so a duration measured on one machine is read against this figure of that
    machine (the same tests took a third of the time on a machine where it was a third)."""
    best = float("inf")
    for _ in range(rounds):
        started, total = time.perf_counter(), 0
        for n in range(10**6):
            total += n
        best = min(best, time.perf_counter() - started)
    return best


def pytest_report_header(config: pytest.Config) -> str:
    return (f"machine: {os.cpu_count()} cores; the reference loop (tests/scheduling.py) takes {reference_loop_s():.3f} s "
            "here: the suite's durations scale with it")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items[:] = longest_first(items, recorded_durations())


class _Recorder:
    """Adds up the duration of every phase of every test, by file, as the reports arrive (on xdist's controller,
    from every worker); writes them at the end of the session."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid.split("::")[0]] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        ranked = sorted(self.seconds.items(), key=lambda kv: -kv[1])
        self.path.write_text(json.dumps({f: round(s, 1) for f, s in ranked}, indent=1) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--record-durations")
    if path and getattr(config, "workerinput", None) is None:  # the controller (or a run without workers)
        config.pluginmanager.register(_Recorder(Path(path)), "runner-durations-recorder")
