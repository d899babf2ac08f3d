"""A host whose ranks hang the job in two attempts in a row is named before the next attempt, and leaves the job as
a host the data-network check names does (runner.worker.pair_check: the same verdict, the same leaving).

Each hang the ranks' dumps diagnose (runner.reports.hangs: a stall past launcher.stall_timeout_s, or a collective's
timeout) says which ranks never entered the collective the others wait in, or cannot answer, and on which hosts.
Before each attempt of a job on several hosts, host 0's agent adds the hang of the attempt before, if there was one,
to its run folder's ``logs/hangs.jsonl`` (:func:`note`) and applies one rule (:func:`named`): where the two attempts
before this one both hung with the ranks behind on one host only, the same host both times, while ranks of other
hosts waited and every rank answered, that host is named.

The ranks behind, not the ranks that timed out: a collective's timeout fires on the ranks that wait in it, the
healthy ones; the host that hangs the job is the one whose ranks never came (a GPU wedged, a kernel or a driver call
that never returns, a rank stuck in a loop). A data network that fails under a live control plane leaves every rank
waiting in the collective, no host behind: the data-network check before the next attempt names that host. Two
attempts, not one: a host behind once may have been slow once (a checkpoint's write, a page cache flushed). Every
rank answered, not some: a rank that said nothing (its host gone, or cut off from host 0) may be the one the ranks
behind wait for. Where host 2's packets to host 0 are dropped, host 0's rank cannot finish its send to host 2 in
the collective before, and looks behind while host 1's rank waits in the next one: naming host 0 would leave the
job to the host that cannot reach it. The cut host's lease, or the data-network check, decides such a host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from runner.records.json_lines import append_document, documents
from runner.records.paths import RunPaths
from runner.records.watch_files import read_diagnosis

HANG_KINDS = ("stall", "timeout")  # the diagnoses of a hang (not "left": a host lost, its ranks gone)
HINT = ("look at that host before it rejoins: where its ranks were (the hang's paragraph above, and in the run "
        "folder), its GPUs (nvidia-smi), its kernel's log (dmesg)")


@dataclass(frozen=True)
class Hang:
    """Attempt ``attempt`` (from 0) hung: ``kind`` (stall, timeout), in ``collective`` (``all_reduce #20``), the
    ranks of ``behind`` never entered it or could not answer, those of ``waiting`` waited in it, the ranks
    ``silent`` said nothing."""

    attempt: int
    kind: str
    collective: str
    behind: tuple[str, ...]
    waiting: tuple[str, ...]
    silent: tuple[int, ...] = ()

    def document(self) -> dict:
        return {**asdict(self), "behind": list(self.behind), "waiting": list(self.waiting),
                "silent": list(self.silent)}

    @classmethod
    def of(cls, doc: object) -> Hang | None:
        if not isinstance(doc, dict):
            return None
        try:
            return cls(int(doc["attempt"]), str(doc["kind"]), str(doc.get("collective", "")),
                       tuple(map(str, doc.get("behind", ()))), tuple(map(str, doc.get("waiting", ()))),
                       tuple(map(int, doc.get("silent", ()))))
        except (KeyError, TypeError, ValueError):
            return None


def note(paths: RunPaths) -> None:
    """The hang of the attempt before ``paths.attempt``, where its diagnosis (still in the run folder: the attempt
    about to start clears it) says one, added to ``paths.hangs`` once. A diagnosis of an earlier attempt is not that
    attempt's: an attempt whose preparation was refused (a host that could not reach the master, a host the check
    named) started no rank and left the diagnosis before it in place, and one hang would count as two in a row."""
    found = read_diagnosis(paths) if paths.attempt >= 1 else None
    if not found or found.get("kind") not in HANG_KINDS or not found.get("behind_hosts"):
        return
    if found.get("attempt") != paths.attempt - 1:
        return
    before = hangs(paths)
    if before and before[-1].attempt >= paths.attempt - 1:
        return
    op, seq = found.get("op"), found.get("collective")
    hang = Hang(paths.attempt - 1, str(found["kind"]), f"{op} #{seq}" if op and seq is not None else "a collective",
                tuple(map(str, found["behind_hosts"])), tuple(map(str, found.get("waiting_hosts", ()))),
                tuple(map(int, found.get("silent", ()))))
    paths.hangs.parent.mkdir(parents=True, exist_ok=True)
    append_document(paths.hangs, hang.document())


def hangs(paths: RunPaths) -> list[Hang]:
    """The hangs recorded so far, in order (none: no file)."""
    found = (Hang.of(doc) for doc in documents(paths.hangs))
    return [hang for hang in found if hang is not None]


def named(recorded: Sequence[Hang], attempt: int, labels: Sequence[str]) -> tuple[int, str] | None:
    """The rule (the module docstring), before ``attempt`` (from 0) of the hosts ``labels``: the node rank of the
    host it names and why, in words that follow the host's name ("host 2 (c) hung the job ..."); None: no host."""
    by_attempt = {h.attempt: h for h in recorded}
    first, last = by_attempt.get(attempt - 2), by_attempt.get(attempt - 1)
    if first is None or last is None or len(last.behind) != 1 or first.behind != last.behind:
        return None
    if first.silent or last.silent:  # the ranks behind may wait for a rank that said nothing
        return None
    (host,) = last.behind
    if host not in labels or not set(first.waiting) - {host} or not set(last.waiting) - {host}:
        return None
    return labels.index(host), (f"hung the job in attempts {attempt - 1} and {attempt}: its ranks never entered the "
                                f"collective the other hosts' ranks waited in ({first.collective}, {first.kind}; then "
                                f"{last.collective}, {last.kind})")
