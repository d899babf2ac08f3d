"""The end of a host's run in words: success, or which rank failed first and why, others summarised."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

from torch.distributed.elastic.multiprocessing.api import RunProcsResult

from runner.outputs import RunPaths
from runner.stop import StopRequest
from runner.rank import RankSetup


def _load(path: str) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def _exit_words(code: int | None) -> str:
    if code is None:
        return "stopped by the launcher"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def report(result: RunProcsResult, setups: list[RankSetup], paths: RunPaths, elapsed_s: float) -> int:
    n = len(setups)
    if not result.is_failed():
        rec = setups[0].record
        where = f" on {rec.host}" if setups[0].world_size > n else ""  # this host's share of the job
        how = "stopped on request (checkpoint and stop)" if StopRequest.requested else "finished"
        print(f"\nrun {how}: {n} process(es){where} in {elapsed_s:.1f} s; outputs in {paths.root}/", flush=True)
        return 0
    done = [s for s in setups if Path(s.done_file).exists()]
    failures = result.failures
    if len(done) == n:
        codes = ", ".join(f"rank {setups[i].record.global_rank} {_exit_words(f.exitcode)}" for i, f in failures.items())
        print(f"\nrun finished: every process completed its recipe, but {codes} while exiting "
              f"(a teardown crash after training, not a training failure); outputs in {paths.root}/", flush=True)
        return 0
    errors = sorted((e for s in setups if (e := _load(s.error_file))), key=lambda e: e["timestamp"])
    out = sys.stderr
    print("\n== job failed ==", file=out)
    if errors:
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
    if rest:
        print("\nthen:", file=out)
        for e in rest:
            print(f"  rank {e['rank']} (host {e['host']}): {e['exception'].splitlines()[0][:200]}", file=out)
    stopped = n - len(errors) - len(done)
    if stopped > 0 and errors:
        print(f"  {stopped} other process(es) were stopped by the launcher", file=out)
    print(f"\nper-rank logs: {paths.logs}/", file=out)
    return 1
