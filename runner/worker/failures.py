"""The end of a host's run in words: success, or which rank failed first and why, others summarised."""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from runner.common import exits
from runner.common.code_paths import faulthandler_frame_of_worker
from runner.common.formatting import error_line, rank_list
from runner.common.lost_peers import lost_a_peer
from runner.records.dumps import DUMP_WAIT_TIMEOUT_S, LOST_PEER_SLACK_S
from runner.records.outcomes import ErrorRecord, RankOutcome, first_failures, timed_out
from runner.records.paths import RunPaths
from runner.records.watch_files import last_request, read_diagnosis, write_diagnosis
from runner.reports.hangs import diagnose
from runner.spec.place import RankPlace
from runner.worker.channel import JobChannel, gather_dumps
from runner.worker.host_ending import HostEnding
from runner.worker.setup import RankSetup, by_rank



def _record_killed(setups: list[RankSetup], codes: dict[int, int], ended_at: dict[int, float]) -> None:
    """An error file for each rank that ended badly without a Python exception (it could write none), stamped with
    when its agent saw it end, so that what reads the run folder afterwards (the run's summary, a sweep's) sees
    which rank failed first."""
    placed = by_rank(setups)
    for rank, code in codes.items():
        placed[rank].outcome.record_error(agent_seen_error(placed[rank].place, f"{_exit_words(code)} (no Python "
                                                           f"exception)", ended_at.get(rank)))


def agent_seen_error(place: RankPlace, text: str, ended_at: float | None = None) -> ErrorRecord:
    """The error record of a rank that could write none, as its agent saw it end (``ended_at``; else now)."""
    return ErrorRecord(rank=place.global_rank, local_rank=place.local_rank, host=place.host, machine=None, pid=None,
                       timestamp=ended_at or time.time(), exception=text, killed=True)


def _exit_words(code: int | None) -> str:
    if code is None:
        return "stopped by the host agent"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


_CRASHES = (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT)


def _why_silent(code: int) -> str:
    """Why a rank that ended badly wrote no error file, as far as its exit status tells."""
    if code >= 0:
        return "it exited without one: os._exit, or a crash in native code"
    if -code in _CRASHES:
        return "a crash in native code (a library's bug, a corrupt tensor, a failed assertion in C++)"
    if -code == signal.SIGKILL:
        return "killed from outside; the kernel's OOM killer? `dmesg` says"
    return "killed by a signal from outside"


def silent_end(code: int) -> str:
    """How a rank that wrote no error ended, and why that may be: "killed by SIGKILL (no Python exception: ...)"."""
    return f"{_exit_words(code)} (no Python exception: {_why_silent(code)})"


def failure_line(setup: RankSetup, code: int) -> str:
    """What a failed rank's error says, in a line (what the other hosts print), or how its process ended."""
    error = setup.outcome.error()
    if error:
        return error_line(error.exception).removeprefix("ScriptExit: ")
    return silent_end(code)


def _log_tail(log_file: Path, lines: int = 5) -> list[str]:
    """The last lines of a rank's log (what a script said before it exited)."""
    try:
        text = log_file.read_text(errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-lines:]


def _script_exit(error: ErrorRecord, setup: RankSetup) -> list[str]:
    """A script that exited with a failure status (argparse does): what it said last, and a hint where it asked
    for --local_rank."""
    said = _log_tail(setup.log_file)
    lines = [f"{error.exception.removeprefix('ScriptExit: ')}" + (":" if said else "")]
    lines += [f"    {line}" for line in said]
    flag = next((f for f in ("--local_rank", "--local-rank") if any(f in s and "required" in s for s in said)), None)
    if flag:
        lines.append(f"    hint: recipe.local_rank_arg={flag} passes it, as torch.distributed.launch did")
    return lines


def report_host_ending(ending: HostEnding, setups: list[RankSetup], paths: RunPaths, elapsed_s: float,
                       announce: bool = True, channel: JobChannel | None = None) -> int:
    """Say how the host's processes ended; the exit status. ``announce``: a line for a success too (not when
    `run`'s own summary follows); ``channel``: the job's (runner.worker.channel), where the ranks of every host
    say whether they joined and where they are. A failure is told in three steps: which rank to name first
    (:func:`choose_first`, a pure choice), the report's lines (:func:`failure_lines`), and the records written."""
    ended_well = _ended_well(ending, setups, paths, elapsed_s, announce)
    if ended_well is not None:
        return ended_well
    errors = first_failures(paths, (s.place.global_rank for s in setups))
    left = _left_early(ending, setups, errors)
    if left is not None:
        return _report_left_early(left, ending, setups, paths, errors)
    choice = choose_first(ending, setups, errors)
    print("\n".join(failure_lines(choice, ending, setups, paths, errors, channel)), file=sys.stderr)
    _record_killed(setups, choice.silent, ending.ended_at)
    if choice.named is not None:  # the run's summary names the rank this report named
        by_rank(setups)[choice.named].outcome.mark_first_failure()
    return exits.FAILED


def _ended_well(ending: HostEnding, setups: list[RankSetup], paths: RunPaths, elapsed_s: float,
                announce: bool) -> int | None:
    """The exit status of a host whose ranks did not fail (or stopped on request, or crashed only in their teardown
    after their work), its line said; None: they failed."""
    n = len(setups)
    stopped_on_request = ending.requested and not ending.failed_by_itself()
    if not ending.failed or stopped_on_request:
        if announce:
            place = setups[0].place
            where = f" on {place.host}" if place.world_size > n else ""  # this host's share of the job
            how = "stopped on request (checkpoint and stop)" if ending.requested else "finished"
            print(f"\nrun {how}: {n} process(es){where} in {elapsed_s:.1f} s; outputs in {paths.root}/", flush=True)
        return exits.OK if not ending.failed else _stopped_status(ending)
    if all(s.outcome.done for s in setups) and not any(s.outcome.failed for s in setups):
        codes = ", ".join(f"rank {rank} {_exit_words(c)}" for rank, c in ending.codes.items() if c)
        print(f"\nrun finished: every process completed its recipe, but {codes} while exiting "
              f"(a teardown crash after training, not a training failure); outputs in {paths.root}/", flush=True)
        return exits.OK
    return None


@dataclass(frozen=True, kw_only=True)
class FirstFailure:
    """Which of a host's ranks its report names first, and what it says after (:func:`choose_first`)."""

    first: int | None  # the first rank (its global rank) that failed by itself, as the agent saw them
    # end (not always the one named: a rank that lost its peer may end before the rank that was killed)
    named: int | None  # the rank the report names first (None: none can be)
    head: ErrorRecord | None  # its error record, where it wrote one
    silent: dict[int, int]  # rank -> exit status: ranks that ended badly by themselves without an exception
    rest: list[ErrorRecord]  # the error records said after it, in order

    @property
    def exited_only(self) -> bool:
        """No rank said why: the named one is the first whose process ended badly."""
        return self.head is None and self.named is not None and self.named not in self.silent


def choose_first(ending: HostEnding, setups: list[RankSetup], errors: list[ErrorRecord]) -> FirstFailure:
    """The rank to name first: the first to fail by itself when it left no record (a signal from outside, os._exit, a
    crash in C); else the record of that rank, unless it only lost a peer (a symptom: its cause comes first); else the
    first record; else the first process that ended badly. Ranks that lost a failed one fail after it."""
    first = ending.first_failure()
    silent = _silent(ending, setups)
    if first is not None and first in silent:
        return FirstFailure(first=first, named=first, head=None, silent=silent, rest=errors)
    if errors:
        head = next((e for e in errors if e.rank == first), errors[0])
        if lost_a_peer(head.exception):  # a symptom: ranks that end in the same look end in no telling order
            cause = next((e for e in errors if not lost_a_peer(e.exception)), None)
            killed = next((i for i in ending.order if i in silent), None)  # a rank that left no record: a cause
            if cause is None and killed is not None:
                return FirstFailure(first=first, named=killed, head=None, silent=silent, rest=errors)
            head = cause or head
        return FirstFailure(first=first, named=head.rank, head=head, silent=silent, rest=[e for e in errors if e is not head])
    named = next((i for i in ending.order if ending.codes.get(i)), None)
    return FirstFailure(first=first, named=named, head=None, silent=silent, rest=[])


def failure_lines(choice: FirstFailure, ending: HostEnding, setups: list[RankSetup], paths: RunPaths,
                  errors: list[ErrorRecord], channel: JobChannel | None) -> list[str]:
    """The report of a host whose ranks failed: the rank named first and why, a hang's summary, the others, and
    where the logs are."""
    lines = ["\n== job failed =="]
    named, head, placed = choice.named, choice.head, by_rank(setups)
    if head is not None:
        setup = placed[named]
        lines.append(f"rank {head.rank} (host {head.host}, local rank {head.local_rank}, pid {head.pid}) "
                     f"failed first:")
        if head.exception.startswith("ScriptExit: "):
            lines += _script_exit(head, setup)
        elif setup.echo.shown and head.traceback:  # its stderr, the traceback with it, is on this terminal
            lines.append(f"{error_line(head.exception, limit=None)} (its traceback is above, and in "
                         f"{setup.log_file})")
        else:
            lines += ["", head.traceback.rstrip()]
    elif named is not None and named in choice.silent:
        lines.append(f"rank {named} (host {placed[named].place.host}) failed first: "
                     f"{silent_end(choice.silent[named])}")
    elif named is not None:
        lines.append(f"rank {named} failed first: {_exit_words(ending.codes[named])} "
                     f"(no Python exception)")
    lines += _hang_summary(errors, setups, paths, channel)
    others = [i for i in choice.silent if i != choice.named]
    if choice.rest or others:
        lines.append("\nthen:")
        lines += [f"  rank {e.rank} (host {e.host}): {error_line(e.exception).removeprefix('ScriptExit: ')}"
                  for e in choice.rest]
        lines += [f"  rank {rank} (host {placed[rank].place.host}): {_exit_words(choice.silent[rank])} "
                  f"(no Python exception)" for rank in others]
    named_first = {named} if choice.exited_only else set()
    accounted = {e.rank for e in errors} | set(choice.silent) | \
        {s.place.global_rank for s in setups if s.outcome.done} | named_first
    stopped = len(setups) - len(accounted)
    if stopped > 0:  # every rank of the host is accounted for: failed first, then, or stopped
        lines.append(f"  {stopped} other process(es) were stopped by the host agent")
    lines.append(f"\nper-rank logs: {paths.logs}/")
    return lines


def _left_early(ending: HostEnding, setups: list[RankSetup], errors: list[ErrorRecord]) -> list[int] | None:
    """The ranks that ended well while the others still ran, before any rank failed, where every failure
    says its connection to another rank closed (runner.common.lost_peers): those that left early, whom the others
    lost. None: no such story."""
    if not errors or not all(lost_a_peer(e.exception) for e in errors):
        return None
    first_error = min(e.timestamp for e in errors)
    left = [i for i in ending.order if ending.codes.get(i) == 0
            and ending.returned_at.get(i, ending.ended_at.get(i, first_error)) < first_error]
    return left or None


def _report_left_early(left: list[int], ending: HostEnding, setups: list[RankSetup], paths: RunPaths,
                       errors: list[ErrorRecord]) -> int:
    """Ranks ended while the others were still running, which then failed on their closed connections: say it as
    that (the rank that left, not the first that lost it), here and in the run folder (the run's summary says the
    same: runner.records.watch_files' diagnosis)."""
    out = sys.stderr
    who = [by_rank(setups)[rank].place for rank in left]
    at = ending.returned_at.get(left[0], ending.ended_at[left[0]]) - ending.began
    lost = sorted(e.rank for e in errors)
    names = ", ".join(str(p.global_rank) for p in who)
    text = (f"rank{'s' if len(who) > 1 else ''} {names} (host {who[0].host}) left at {at:.1f} s while the others were "
            f"still running: {'their processes' if len(who) > 1 else 'its process'} ended with status 0, and "
            f"rank(s) {', '.join(map(str, lost))} then failed on {'their' if len(who) > 1 else 'its'} closed "
            f"connection")
    print(f"\n== job failed ==\n{text}", file=out)
    head = errors[0]
    print(f"  rank {head.rank} (host {head.host}) failed first: {error_line(head.exception)}", file=out)
    print("    hint: every rank must make the same collectives in the same order until each destroys its process "
          "group (a rank that returns early, on fewer batches or steps, leaves the others waiting for it)", file=out)
    print(f"\nper-rank logs: {paths.logs}/", file=out)
    write_diagnosis(paths, "left", text, {"left": [p.global_rank for p in who], "lost": lost, "at_s": round(at, 1)})
    _record_killed(setups, _silent(ending, setups), ending.ended_at)
    return exits.FAILED


def _silent(ending: HostEnding, setups: list[RankSetup]) -> dict[int, int]:
    """rank -> exit status: the ranks that ended badly by themselves (not stopped by the agent) and wrote no error."""
    placed = by_rank(setups)
    return {rank: code for rank, code in ending.codes.items()
            if code and rank not in ending.stopped and not placed[rank].outcome.failed}


def _stopped_status(ending: HostEnding) -> int:
    """Ranks that ended on the signal a stop request sent them (a script's SIGTERM): 128 + that signal."""
    code = next(c for c in ending.codes.values() if c)
    return exits.from_signal(-code) if code < 0 else code


def _last_stack(log_file: str, frames: int = 8) -> list[str]:
    """The main thread's frames of the last stack dump in a rank's log (faulthandler, runner.worker.rank_process.STACK_SIGNAL)."""
    try:
        lines = Path(log_file).read_text(errors="replace").splitlines()
    except OSError:
        return []
    starts = [i for i, line in enumerate(lines) if line.startswith("Current thread ")]
    if not starts:
        return []
    block = []
    for line in lines[starts[-1] + 1:]:
        if not line.startswith("  File ") or faulthandler_frame_of_worker(line) or "<frozen runpy>" in line:
            break  # the recipe's (or script's) frames, not the runner's below them
        block.append(line.strip())
    return block[:frames]


NOT_ARRIVED_HINT = ("    hint: were their hosts started, and can they reach the master? `run ... preflight=true` "
                    "checks every host's route, port and interface")  # where ranks (or whole hosts) never came


def _hang_summary(errors: list[ErrorRecord], setups: list[RankSetup], paths: RunPaths,
                  channel: JobChannel | None = None) -> list[str]:
    """When ranks failed by timing out: which ranks never joined the process group, or the collective each
    rank is in (runner.reports.hangs, from their dumps), else which did not arrive at the collective the others
    waited in and where those were (their stack dumps). A stall already said it (its rank 0's error)."""
    said = read_diagnosis(paths)
    if said is not None:
        return [] if said.get("kind") == "stall" else ["", f"hang: {said['text']}"]
    if not any(timed_out(e) for e in errors):
        return []
    timeout = setups[0].spec.init.timeout_s
    world = setups[0].place.world_size
    joined = {r for r in range(world) if RankOutcome(paths, r).joined}
    if channel is not None and len(joined) < world:  # the other hosts' ranks say so on the channel
        joined |= set(channel.joined(paths.attempt, range(world)))
    waited = sorted(e.rank for e in errors if timed_out(e))
    if len(joined) < world:
        missing = sorted(set(range(world)) - set(joined) - set(waited))
        return ["", f"timeout: the process group did not form within init.timeout_s={timeout:g} s: rank(s) "
                    f"{rank_list(waited, 12)} waited, rank(s) {rank_list(missing, 12) or 'none'} did not arrive"
                    + (" (as seen from this host)" if len(setups) < world else ""),
                NOT_ARRIVED_HINT]
    asked = last_request(paths)
    if asked is not None:  # the ranks were asked where they are: the collective each one is in
        found = diagnose(gather_dumps(paths, channel, range(world), asked - LOST_PEER_SLACK_S, DUMP_WAIT_TIMEOUT_S),
                         world)
        if found is not None:
            text = f"timeout: a collective waited init.timeout_s={timeout:g} s: {found.text}"
            write_diagnosis(paths, "timeout", text, found.document())
            return ["", text, "    hint: a rank that skips, repeats or reorders a collective, or is slower than the "
                              "timeout; init.timeout_s sets the limit, launcher.stall_timeout_s ends a stall sooner"]
    local = {s.place.global_rank: s for s in setups}
    failed = {e.rank for e in errors}
    absent = [r for r in range(world) if r not in failed and not RankOutcome(paths, r).done]
    lines = ["", f"timeout: rank(s) {rank_list(waited, 12)} waited init.timeout_s={timeout:g} s in a collective; "
                 f"rank(s) {rank_list(absent, 12) or 'none'} did not arrive"]
    for r in absent:
        stack = _last_stack(str(local[r].log_file)) if r in local else []
        if stack:
            lines.append(f"  rank {r} was at (most recent call first):")
            lines += [f"    {frame}" for frame in stack]
    lines.append("    hint: a rank that skips or repeats a collective, or is slower than the timeout; "
                 "init.timeout_s sets the limit")
    return lines
