"""The end of a host's run in words: success, or which rank failed first and why, others summarised."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from runner.common import exits
from runner.common.signals import StopRequest
from runner.common.timeouts import is_timeout_text
from runner.plan.diagnostics import collect_dumps, diagnose, last_request, read_diagnosis, write_diagnosis
from runner.plan.outcome import ErrorRecord, RankOutcome, first_failures
from runner.plan.paths import RunPaths
from runner.worker.setup import RankSetup

if TYPE_CHECKING:  # torch stays out of `run`'s own process, which reads the error files too (runner.reports.run_summary)
    from torch.distributed.elastic.multiprocessing.api import RunProcsResult


def _record_killed(setups: list[RankSetup], killed: dict[int, int]) -> None:
    """An error file for each rank that died without a Python exception (it could write none), so that
    what reads the run folder afterwards (the run's summary, a sweep's) sees which rank failed first."""
    for i, code in killed.items():
        rec = setups[i].record
        setups[i].outcome.record_error(ErrorRecord(rec.global_rank, rec.local_rank, rec.host, None, None, time.time(),
                                                   f"{_exit_words(code)} (no Python exception)", killed=True))


def _exit_words(code: int | None) -> str:
    if code is None:
        return "stopped by the launcher"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def report(result: RunProcsResult, setups: list[RankSetup], paths: RunPaths, elapsed_s: float,
           killed: dict[int, int] | None = None, announce: bool = True) -> int:
    """Say how the host's processes ended; the exit status. ``killed``: local ranks that died of a signal
    from outside (no Python exception) -> exit code, as the launcher saw them before stopping the others.
    ``announce``: a line for a success too (not when `run`'s own summary follows)."""
    n = len(setups)
    if not result.is_failed():
        if not announce:
            return exits.OK
        rec = setups[0].record
        where = f" on {rec.host}" if setups[0].world_size > n else ""  # this host's share of the job
        how = "stopped on request (checkpoint and stop)" if StopRequest.requested else "finished"
        print(f"\nrun {how}: {n} process(es){where} in {elapsed_s:.1f} s; outputs in {paths.root}/", flush=True)
        return exits.OK
    done = [s for s in setups if s.outcome.done]
    failures = result.failures
    if len(done) == n:
        codes = ", ".join(f"rank {setups[i].record.global_rank} {_exit_words(f.exitcode)}" for i, f in failures.items())
        print(f"\nrun finished: every process completed its recipe, but {codes} while exiting "
              f"(a teardown crash after training, not a training failure); outputs in {paths.root}/", flush=True)
        return exits.OK
    errors = first_failures(paths, (s.record.global_rank for s in setups))
    out = sys.stderr
    print("\n== job failed ==", file=out)
    # a rank killed by a signal leaves no error file; the ranks that lost it fail after it, with errors
    # about their lost peer: the killed one is the cause
    killed = killed or {}
    if killed:
        for i, code in killed.items():
            why = ("killed from outside; the kernel's OOM killer? `dmesg` says" if code < 0 else
                   "it exited without one: os._exit or sys.exit in the recipe, or a crash in native code")
            print(f"rank {setups[i].record.global_rank} (host {setups[i].record.host}) failed first: "
                  f"{_exit_words(code)} (no Python exception: {why})", file=out)
        rest = errors
    elif errors:
        first = errors[0]
        print(f"rank {first['rank']} (host {first['host']}, local rank {first['local_rank']}, pid {first['pid']}) "
              f"failed first:\n", file=out)
        print(first["traceback"].rstrip(), file=out)
        rest = errors[1:]
    else:
        rest = []
        for i, f in failures.items():
            print(f"rank {setups[i].record.global_rank} failed first: {_exit_words(f.exitcode)} (no Python exception)",
                  file=out)
    for line in _hang_summary(errors, setups, paths):
        print(line, file=out)
    if rest:
        print("\nthen:", file=out)
        for e in rest:
            print(f"  rank {e['rank']} (host {e['host']}): {e['exception'].splitlines()[0][:200]}", file=out)
    stopped = n - len(errors) - len(done) - len(killed)
    if stopped > 0:  # every rank of the host is accounted for: failed first, then, or stopped
        print(f"  {stopped} other process(es) were stopped by the launcher", file=out)
    print(f"\nper-rank logs: {paths.logs}/", file=out)
    _record_killed(setups, killed)
    return exits.FAILED


DUMP_WAIT_S = 2.0  # how long the report waits for the ranks' dumps after a timeout


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks)) if len(ranks) <= 12 else f"{', '.join(map(str, ranks[:12]))}, ... ({len(ranks)})"


_RUNNER_DIR = f'"{Path(__file__).resolve().parent}{os.sep}'  # how faulthandler writes a frame of the runner


def _last_stack(log_file: str, frames: int = 8) -> list[str]:
    """The main thread's frames of the last stack dump in a rank's log (faulthandler, runner.worker.rank.STACK_SIGNAL)."""
    try:
        lines = Path(log_file).read_text(errors="replace").splitlines()
    except OSError:
        return []
    starts = [i for i, line in enumerate(lines) if line.startswith("Current thread ")]
    if not starts:
        return []
    block = []
    for line in lines[starts[-1] + 1:]:
        if not line.startswith("  File ") or _RUNNER_DIR in line or "<frozen runpy>" in line:
            break  # the recipe's (or script's) frames, not the runner's below them
        block.append(line.strip())
    return block[:frames]


def _hang_summary(errors: list[dict], setups: list[RankSetup], paths: RunPaths) -> list[str]:
    """When ranks failed by timing out: which ranks never joined the process group, or the collective each
    rank is in (runner.plan.diagnostics: their dumps), else which did not arrive at the collective the others
    waited in and where those were (their stack dumps). A stall already said it (its rank 0's error)."""
    said = read_diagnosis(paths)
    if said is not None:
        return [] if said.get("kind") == "stall" else ["", f"hang: {said['text']}"]
    if not any(is_timeout_text(e["exception"]) for e in errors):
        return []
    timeout = setups[0].spec.init.timeout_s
    world = setups[0].world_size
    joined = [r for r in range(world) if RankOutcome(paths, r).joined]
    waited = sorted(e["rank"] for e in errors if is_timeout_text(e["exception"]))
    if len(joined) < world:
        missing = sorted(set(range(world)) - set(joined) - set(waited))
        return ["", f"timeout: the process group did not form within init.timeout_s={timeout:g} s: rank(s) "
                    f"{_ranks(waited)} waited, rank(s) {_ranks(missing) or 'none'} did not arrive"
                    + (" (as seen from this host)" if len(setups) < world else ""),
                "    hint: were their hosts started, and can they reach the master? `run ... preflight=true` "
                "checks every host's route, port and interface"]
    asked = last_request(paths)
    if asked is not None:  # the ranks were asked where they are: the collective each one is in
        found = diagnose(collect_dumps(paths, range(world), asked, DUMP_WAIT_S), world)
        if found is not None:
            text = f"timeout: a collective waited init.timeout_s={timeout:g} s: {found.text}"
            write_diagnosis(paths, "timeout", text, found.document())
            return ["", text, "    hint: a rank that skips, repeats or reorders a collective, or is slower than the "
                              "timeout; init.timeout_s sets the limit, launcher.stall_timeout_s ends a stall sooner"]
    local = {s.record.global_rank: s for s in setups}
    failed = {e["rank"] for e in errors}
    absent = [r for r in range(world) if r not in failed and not RankOutcome(paths, r).done]
    lines = ["", f"timeout: rank(s) {_ranks(waited)} waited init.timeout_s={timeout:g} s in a collective; "
                 f"rank(s) {_ranks(absent) or 'none'} did not arrive"]
    for r in absent:
        stack = _last_stack(str(local[r].log_file)) if r in local else []
        if stack:
            lines.append(f"  rank {r} was at (most recent call first):")
            lines += [f"    {frame}" for frame in stack]
    lines.append("    hint: a rank that skips or repeats a collective, or is slower than the timeout; "
                 "init.timeout_s sets the limit")
    return lines
