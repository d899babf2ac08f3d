"""How a host's preflight ended, as its agent says it once its processes have ended (each ran
runner.worker.preflight.collective)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from runner.common import exits
from runner.records.paths import RunPaths
from runner.worker.host_ending import HostEnding
from runner.worker.preflight.checks import PreflightFailed
from runner.worker.setup import RankSetup


def outcome(ending: HostEnding, setups: Sequence[RankSetup], paths: RunPaths) -> int:
    """A host's preflight processes have ended: 0 when all passed, else the failure's line on stderr
    (the host's reporting process's, if it failed) and the exit status 1."""
    if not ending.failed:
        return 0
    errors = [(s.preflight is None, e) for s in setups if (e := s.outcome.error())]
    errors.sort(key=lambda e: (e[0], e[1].timestamp))
    if errors:
        print(errors[0][1].exception.removeprefix(f"{PreflightFailed.__name__}: "), file=sys.stderr)
    others = sum(1 for code in ending.codes.values() if code) - min(1, len(errors))
    what = "other process(es)" if errors else "process(es)"  # "other" than the one whose line is above
    also = f" ({others} {what} of this host failed or were stopped)" if others > 0 else ""
    print(f"preflight failed on {setups[0].place.host}{also}; per-rank logs: {paths.logs}/", file=sys.stderr)
    return exits.FAILED
