"""What the ranks' dumps say of a hang, or of a slow rank: which collective each rank is in, and the rank the others
waited for, in words (runner.records.dumps holds what the ranks record; runner.records.watch_files how they are asked).

:func:`diagnose` reads the dumps of a hang::

    ranks 0,1,3 wait in all_reduce #21 (process group 0) since 15.0 s; rank 2 never entered it: its last
    collective was all_reduce #20, and it is at train.py:57 in main

and :func:`straggler` the dumps of a finished run: the rank the others waited for.

Why not torch's own analyzer (``torch.distributed.flight_recorder``: ``fr_trace``, ``build_db``), which matches
the ranks' flight-recorder buffers too and names the ranks missing from a collective: it does not fit what the ranks
have here. It reads every rank's whole buffer, as pickle files in one folder, and refuses an incomplete set unless
told otherwise; the ranks here answer on the job's channel, from hosts that share no folder, with their last entries,
and where torch has no flight recorder from the runner's own counter. It does not read a gloo buffer at all: in
torch 2.13 a gloo group's ``pg_config`` is keyed ``''`` while its entries name group ``'0'``, and ``build_db`` stops
at ``KeyError: ('0', 0)`` (tests/reports/test_hangs.py shows it, and fails once torch reads one). Patched by hand, it
names the rank missing from the collective, as :func:`diagnose` does, but not how long the others waited, where
the missing rank is in the user's code, nor a straggler. And it imports torch, which `run`'s own process, where
Ctrl-\\ asks for this paragraph, never does.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from runner.common.formatting import rank_list
from runner.records.dumps import RankDump

# ----------------------------------------------------------------------------------------- a hang in words




def _plural(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_list(ranks, 16, sep=',')}"


@dataclass(frozen=True)
class Diagnosis:
    """Where a hung job's ranks are, in one paragraph and as facts (for run_summary.json)."""

    text: str
    group: str | None = None
    seq: int | None = None
    op: str | None = None
    waiting: tuple[int, ...] = ()  # in the collective, for the others
    absent: tuple[int, ...] = ()  # never entered it
    mismatched: dict[str, tuple[int, ...]] = field(default_factory=dict)  # op -> ranks, when they differ
    silent: tuple[int, ...] = ()  # wrote no dump (gone, or a host whose run folder is not shared)
    behind_hosts: tuple[str, ...] = ()  # the hosts of the ranks that never entered it or cannot answer
    waiting_hosts: tuple[str, ...] = ()  # the hosts of the ranks in it

    def document(self) -> dict[str, Any]:
        return {"text": self.text, "process_group": self.group, "collective": self.seq, "op": self.op,
                "waiting": list(self.waiting), "absent": list(self.absent),
                "mismatched": {k: list(v) for k, v in self.mismatched.items()}, "silent": list(self.silent),
                "behind_hosts": list(self.behind_hosts), "waiting_hosts": list(self.waiting_hosts)}


def stuck_ranks(dumps: Mapping[int, RankDump]) -> str:
    """The ranks that cannot answer (their host agent said why), in words; "" when none."""
    return "; ".join(f"rank {r} cannot answer: {d.stuck}" for r, d in sorted(dumps.items()) if d.stuck)


def _mismatched(dumps: Mapping[int, RankDump], entered: Mapping[int, Any], ops: Mapping[str, list[int]], main_op: str,
                last: int, where: str) -> list[str]:
    """The words for ranks that entered different collectives under one number, and where each rank's main thread is
    in the user's code."""
    shapes = {op: next((e.shape() for r, e in entered.items() if e and e.op == op), "") for op in ops}
    others = [op for op in ops if op != main_op]
    said = "; ".join(f"{_plural(sorted(ops[op]))} entered {op} #{last}" + (f" ({shapes[op]})" if shapes[op] else "")
                     for op in others)
    parts = [f"{said} while {_plural(sorted(ops[main_op]))} entered {main_op} #{last}"
             + (f" ({shapes[main_op]})" if shapes[main_op] else "") + where]
    places: dict[str, list[int]] = {}
    for r in sorted(entered):
        if dumps[r].at:
            places.setdefault(dumps[r].at, []).append(r)
    if places:
        parts.append(", ".join(f"{_plural(rs)} {'is' if len(rs) == 1 else 'are'} at {at}"
                               for at, rs in sorted(places.items(), key=lambda kv: kv[1])))
    return parts


def diagnose(dumps: Mapping[int, RankDump], world_size: int) -> Diagnosis | None:
    """The paragraph for a hang from the ranks' dumps; None when no rank recorded a collective."""
    silent = tuple(r for r in range(world_size) if r not in dumps)
    stuck = stuck_ranks(dumps)
    stuck_hosts = {d.host for d in dumps.values() if d.stuck}
    dumps = {r: d for r, d in dumps.items() if not d.stuck}
    # the process group the hang is in: the one whose collectives the ranks are furthest apart in, else the default
    groups = sorted({g.group for d in dumps.values() for g in d.groups}, key=lambda g: (g != "0", g))
    if not groups:
        return None

    def spread(name: str) -> int:
        seqs = [g.enqueued for d in dumps.values() if (g := d.group(name))]
        return max(seqs) - min(seqs) if seqs else -1

    group = max(groups, key=lambda name: (spread(name), name == "0"))
    views = {r: g for r, d in dumps.items() if (g := d.group(group)) is not None}
    if not views:
        return None
    last = max(v.enqueued for v in views.values())
    if last == 0:
        return None
    entered = {r: v.entry(last) for r, v in views.items() if v.enqueued >= last}
    absent = tuple(sorted(r for r, v in views.items() if v.enqueued < last))
    ops: dict[str, list[int]] = {}
    for r, e in entered.items():
        ops.setdefault(e.op if e else "?", []).append(r)
    main_op = max(ops, key=lambda op: (len(ops[op]), op))
    waiting = tuple(sorted(entered))
    now = max(d.time for d in dumps.values())
    since = [now - e.entered_s for e in entered.values() if e and e.entered_s]
    where = f" (process group {group})"
    if len(ops) > 1:  # the same collective number, different collectives
        parts = _mismatched(dumps, entered, ops, main_op, last, where)
    else:
        shape = next((e.shape() for e in entered.values() if e), "")
        verb = "waits" if len(waiting) == 1 else "wait"
        parts = [f"{_plural(list(waiting))} {verb} in {main_op} #{last}{where}"
                 + (f" since {min(since):.1f} s" if since else "") + (f" ({shape})" if shape else "")]
    for r in absent:
        v = views[r]
        prev = v.entry(v.enqueued)
        before = f"{prev.op} #{prev.seq}" if prev else (f"#{v.enqueued}" if v.enqueued else "none")
        at = dumps[r].at
        parts.append(f"rank {r} never entered it: its last collective was {before}" + (f", and it is at {at}" if at else ""))
    if stuck:
        parts.append(stuck)
    if silent:
        parts.append(f"{_plural(list(silent))} said nothing (gone, or on a host whose run folder is not this one)")
    mismatched = {op: tuple(sorted(rs)) for op, rs in ops.items()} if len(ops) > 1 else {}
    behind = tuple(sorted({dumps[r].host for r in absent} | stuck_hosts))
    return Diagnosis("; ".join(parts), group, last, main_op, waiting, absent, mismatched, silent, behind,
                     tuple(sorted({dumps[r].host for r in waiting})))


# ----------------------------------------------------------------------------------------- the straggler


@dataclass(frozen=True)
class Straggler:
    rank: int
    host: str
    ratio: float  # its time between collectives over the median rank's
    waited_s: float  # what the others waited for it, over the collectives recorded
    collectives: int  # how many collectives that is measured over

    def text(self) -> str:
        return (f"rank {self.rank} on {self.host}: {self.ratio:.2f}x the median step time; the others waited "
                f"{self.waited_s:.1f} s for it over the last {self.collectives} collectives")


def straggler(dumps: Mapping[int, RankDump], min_ratio: float = 1.2, min_collectives: int = 5,
              min_waited_s: float = 1.0, min_share: float = 0.05) -> Straggler | None:
    """The rank the others persistently waited for, from when each rank entered the same collectives.

    A rank's time for collective k is from the end of collective k-1 (when the last rank entered it) to its
    own entering k: its own work between them. The straggler's median is ``min_ratio`` or more times the
    median of the other ranks', and it is the last to enter most collectives; the others waited, at each
    collective, from their median entry to its. What they waited must matter too: at least ``min_waited_s``
    and ``min_share`` of the time the collectives span (a 3-second job whose ranks waited 0.1 s has none)."""
    if len(dumps) < 2:
        return None
    arrivals: dict[int, dict[int, float]] = {}
    for r, d in dumps.items():
        g = d.group("0")
        if g is None:
            return None
        arrivals[r] = {e.seq: e.entered_s for e in g.entries if e.entered_s}
    common = sorted(set.intersection(*(set(a) for a in arrivals.values())))
    if len(common) < min_collectives + 1:
        return None
    work: dict[int, list[float]] = {r: [] for r in arrivals}
    waited = 0.0
    last_counts: dict[int, int] = {r: 0 for r in arrivals}
    for prev, seq in zip(common, common[1:]):
        if seq != prev + 1:
            continue
        done_prev = max(a[prev] for a in arrivals.values())
        times = {r: a[seq] for r, a in arrivals.items()}
        for r, t in times.items():
            work[r].append(max(0.0, t - done_prev))
        latest = max(times, key=lambda r: times[r])
        last_counts[latest] += 1
        waited += times[latest] - statistics.median(t for r, t in times.items() if r != latest)
    medians = {r: statistics.median(w) for r, w in work.items() if w}
    if len(medians) < 2:
        return None
    slowest = max(medians, key=lambda r: medians[r])
    typical = statistics.median(m for r, m in medians.items() if r != slowest)
    measured = len(work[slowest])
    if typical <= 0 or medians[slowest] < min_ratio * typical or last_counts[slowest] < measured / 2:
        return None
    span = max(a[common[-1]] for a in arrivals.values()) - min(a[common[0]] for a in arrivals.values())
    if waited < max(min_waited_s, min_share * span):
        return None
    return Straggler(slowest, dumps[slowest].host, medians[slowest] / typical, waited, measured)
