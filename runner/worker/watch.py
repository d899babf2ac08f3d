"""A rank's watch: a daemon thread beside the recipe that records when the rank last made progress, writes
what it knows of its collectives when asked (runner.records.dumps, runner.records.watch_files), and, in rank 0, ends a job that has
stalled (launcher.stall_timeout_s).

It runs while the main thread is blocked in a collective (gloo and NCCL release the GIL while they wait) or
asleep. The collectives come from torch's flight recorder (TORCH_FR_BUFFER_SIZE, set for every rank from
log.collectives: runner.environments.child); where it is missing, from the runner's own per-group counter of
the torch.distributed calls the recipe makes (:class:`_Counter`, which does not see DDP's own all-reduces).
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
import sysconfig
import threading
import time
import traceback
from typing import Any

from runner.common.code_paths import RUNNER_DIR
from runner.records.dumps import DUMP_WAIT_STALL_S, Collective, GroupRecord, RankDump
from runner.records.watch_files import RankWatchFiles, requested_since, write_diagnosis
from runner.reports.hangs import diagnose
from runner.training.output import AgentChannel
from runner.training.progress import StepCount
from runner.worker.channel import JobChannel, ask_for_dumps, gather_dumps
from runner.worker.setup import RankSetup

TICK_S = 0.25  # how often the watch looks
BEAT_S = 1.0  # a heartbeat is written at most this often (and only after progress); the agent hears one this often
ENTRIES = 16  # entries per process group kept in a dump of a hang (the last ones tell where it is)


# torch's flight recorders: NCCL's groups are kept in one of their own (CUDA builds only), every other backend's in
# the other; a job may have groups of both (NCCL for tensors, gloo for objects)
_RECORDERS = ("_dump_fr_trace_json", "_dump_nccl_trace_json")


def _fr_dump(entries: bool = True) -> dict[str, Any] | None:
    """The flight recorders' record of this process's collectives, every group's in one document (``entries=False``:
    only each group's status, the last collective enqueued and completed; what the watch asks four times a second: a
    few microseconds, where the entries are tens of kilobytes of JSON per hundred collectives, milliseconds of the
    GIL); None without a recorder."""
    try:
        import torch

        c10d = torch._C._distributed_c10d
        raws = [getattr(c10d, name)(entries, False) for name in _RECORDERS if hasattr(c10d, name)]
    except (AttributeError, RuntimeError, TypeError):  # (includeCollectives, onlyActive) no longer what they were
        return None
    docs = [doc for doc in map(json.loads, raws) if isinstance(doc, dict) and "pg_status" in doc]
    if not docs:
        return None
    merged = {**docs[0], "pg_status": {pg: status for doc in docs for pg, status in doc["pg_status"].items()}}
    if entries:
        merged["entries"] = [entry for doc in docs for entry in doc.get("entries", ())]
    return merged


def _op(name: str) -> str:
    return name.split(":", 1)[-1] if name else "?"


def _groups_from_fr(doc: dict[str, Any]) -> tuple[GroupRecord, ...]:
    entries: dict[str, list[Collective]] = {}
    for e in doc.get("entries", ()):
        if not e.get("collective_seq_id"):
            continue  # point-to-point
        entries.setdefault(str(e.get("pg_id", "0")), []).append(Collective(
            int(e["collective_seq_id"]), _op(e.get("profiling_name", "")),
            tuple(tuple(s) for s in e.get("input_sizes") or ()), tuple(e.get("input_dtypes") or ()),
            (e.get("time_created_ns") or 0) / 1e9))
    groups = []
    for pg, status in doc.get("pg_status", {}).items():
        kept = sorted(entries.get(str(pg), []), key=lambda c: c.seq)
        groups.append(GroupRecord(str(pg), int(status.get("last_enqueued_collective", 0)),
                                  int(status.get("last_completed_collective", -1)), tuple(kept)))
    return tuple(groups)


def group_key(group: Any) -> str:
    """A process group as every rank names it, as the flight recorder does: torch's name of the group ("0" the
    default one, then "1", "2", ... in the order the ranks made them, which is the same on every rank)."""
    from torch.distributed.distributed_c10d import GroupMember, _get_process_group_name

    if group is None:  # the default group, by its own name: "0", unless an earlier default group was destroyed
        group = GroupMember.WORLD
        if group is None:
            return "0"
    return _get_process_group_name(group)


class _Counter:
    """The runner's own record where torch has no flight recorder: the torch.distributed collectives the
    recipe calls, numbered per process group."""

    OPS = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "reduce",
           "gather", "scatter", "all_to_all_single", "barrier")

    def __init__(self) -> None:
        self.entered: dict[str, list[Collective]] = {}
        self.completed: dict[str, int] = {}

    def install(self) -> None:
        import torch.distributed as dist

        for name in self.OPS:
            original = getattr(dist, name, None)
            if original is not None:
                setattr(dist, name, self._wrap(name, original))

    def _wrap(self, name: str, original: Any) -> Any:
        try:
            signature: inspect.Signature | None = inspect.signature(original)
        except (TypeError, ValueError):
            signature = None

        @functools.wraps(original)
        def counted(*args: Any, **kwargs: Any) -> Any:
            try:
                group = signature.bind(*args, **kwargs).arguments.get("group") if signature else kwargs.get("group")
            except TypeError:  # the call itself is wrong: torch says so below
                group = None
            seen = self.entered.setdefault(group_key(group), [])
            tensor = next((a for a in args if hasattr(a, "shape")), None)
            seq = len(seen) + 1
            seen.append(Collective(seq, name, (tuple(tensor.shape),) if tensor is not None else (),
                                   (str(tensor.dtype).removeprefix("torch."),) if tensor is not None else (), time.time()))
            del seen[:-ENTRIES]
            result = original(*args, **kwargs)
            self.completed[group_key(group)] = seq
            return result

        return counted

    def groups(self) -> tuple[GroupRecord, ...]:
        return tuple(GroupRecord(g, e[-1].seq if e else 0, self.completed.get(g, 0), tuple(e))
                     for g, e in self.entered.items())


_NOT_USER_CODE = (str(RUNNER_DIR), sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
                  sysconfig.get_paths()["platlib"], "<")


def main_thread_at(workdir: str | None) -> str:
    """Where the main thread is, in the user's code: ``train.py:57 in main`` (its innermost frame outside the
    runner, the installed packages and Python's own)."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    if frame is None:
        return ""
    for summary in reversed(traceback.extract_stack(frame)):
        name = summary.filename
        if name.startswith(_NOT_USER_CODE):
            continue
        shown = os.path.relpath(name, workdir) if workdir and name.startswith(workdir + os.sep) else os.path.basename(name)
        return f"{shown}:{summary.lineno} in {summary.name}"
    return ""


class Watch(threading.Thread):
    """The watch of one rank (see the module docstring)."""

    def __init__(self, setup: RankSetup, channel: JobChannel | None = None, steps: StepCount | None = None,
                 agent: AgentChannel | None = None) -> None:
        super().__init__(name="runner-watch", daemon=True)
        self.setup = setup
        self.agent = agent  # its host agent hears that the watch runs (runner.worker.rank_life), and its progress
        self.steps = steps if steps is not None else StepCount()  # the recipe's progress steps (none for a script)
        self.files = RankWatchFiles(setup.paths, setup.place.global_rank)
        self.channel = channel  # the job's (runner.worker.channel): requests and dumps across hosts
        self.counter: _Counter | None = None
        self._began = time.time()
        self._joined_s: float | None = None  # when rank 0's watch saw it join the process group (the stall clock's start)
        self._handled = self._began
        self._last_marker: object = None
        self._progressed = self._began
        self._beat_written = 0.0
        self._alive_said = 0.0
        self._first_step_said = False  # the agent heard this attempt's first progress step (runner.worker.agent_reports)
        self._done = threading.Event()
        self._lock = threading.Lock()

    # -- what the rank calls -----------------------------------------------------------------------------
    def begin(self) -> None:
        """Start watching (after the process group exists, or before a script makes its own)."""
        if _fr_dump(entries=False) is None and self.setup.spec.log.collectives:
            self.counter = _Counter()
            self.counter.install()
        self.start()

    def dump(self, reason: str) -> None:
        """Write this rank's record of its collectives and where it is (runner.records.dumps.RankDump)."""
        with self._lock:
            doc = _fr_dump()
            groups = _groups_from_fr(doc) if doc is not None else (self.counter.groups() if self.counter else ())
            if reason != "end":  # the end's keeps all, for the straggler (runner.reports.hangs.straggler)
                groups = tuple(GroupRecord(g.group, g.enqueued, g.completed, g.entries[-ENTRIES:]) for g in groups)
            source = "flight recorder" if doc is not None else "runner counter"
            place = self.setup.place
            found = RankDump(place.global_rank, place.host, time.time(), reason, source, groups,
                             main_thread_at(self.setup.spec.workdir))
            self.files.write_dump(found)  # the run folder's record (the summary's straggler reads it)
            if self.channel is not None:  # and for whoever asked, on whatever host
                self.channel.put_dump(place.global_rank, found.document())

    def finish(self) -> None:
        """The recipe returned: a last dump (the run's straggler is found from them), and the watch ends."""
        self._done.set()
        try:
            self.dump("end")
        except Exception:  # noqa: BLE001 (a diagnosis must never fail a finished rank)
            pass

    # -- the thread --------------------------------------------------------------------------------------
    def run(self) -> None:
        stall = self.setup.spec.launcher.stall_timeout_s if self.setup.place.global_rank == 0 else None
        while not self._done.wait(TICK_S):
            try:
                self._look(stall)
            except Exception as e:  # noqa: BLE001 (the watch must not take the rank down)
                print(f"runner watch: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                return

    def _marker(self) -> object:
        doc = _fr_dump(entries=False)
        if doc is not None:
            completed = tuple(sorted((pg, s.get("last_completed_collective"), s.get("last_enqueued_collective"))
                                     for pg, s in doc.get("pg_status", {}).items()))
        else:
            completed = tuple(sorted(self.counter.completed.items())) if self.counter else ()
        return completed, self.steps.taken

    def _look(self, stall_timeout_s: float | None) -> None:
        now = time.time()
        marker = self._marker()
        if marker != self._last_marker:
            self._last_marker, self._progressed = marker, now
        steps = self.steps
        first_step = steps.position is not None and steps.resumed is not None and steps.position > steps.resumed
        if self.agent is not None and (now - self._alive_said >= BEAT_S or first_step and not self._first_step_said):
            self.agent.alive(self._progressed, steps.position, steps.resumed)  # the attempt's first step at once:
            self._alive_said, self._first_step_said = now, self._first_step_said or first_step  # what a loss cost
        if self._progressed > self._beat_written and now - self._beat_written >= BEAT_S:
            self.files.write_beat(self._progressed)
            if self.channel is not None:
                self.channel.put_beat(self.setup.place.global_rank, self._progressed)
            self._beat_written = now
        reason = self._requested()
        if reason is not None:
            self._handled = now
            self.dump(reason)
        if stall_timeout_s is not None:
            self._watch_for_a_stall(stall_timeout_s, now)

    def _requested(self) -> str | None:
        """The reason of a request for this rank's dump made since the last it answered: through the job's channel
        (any host), or the run folder's request file (`run` on a Slurm login node asks there)."""
        asked = self.channel.dump_request() if self.channel is not None else None
        if asked is not None and asked.time > self._handled:
            return asked.reason
        return requested_since(self.setup.paths, self._handled)

    def _beats(self, world: int) -> list[float | None]:
        if self.channel is not None:
            return [self.channel.beat(r) for r in range(world)]
        return [RankWatchFiles(self.setup.paths, r).last_progress() for r in range(world)]

    def _watch_for_a_stall(self, timeout_s: float, now: float) -> None:
        """Rank 0: when no rank has made progress for ``timeout_s`` since the process group formed, say where every
        rank is and end the job. Forming the group is not a stall (init.timeout_s bounds it): a host slow to start
        would otherwise be taken for a hang."""
        if self._joined_s is None:
            if not self.setup.outcome.joined:  # this rank joins once every rank has reached the rendezvous
                return
            self._joined_s = now
        world = self.setup.place.world_size
        latest = max([self._progressed, self._joined_s, *(b for b in self._beats(world) if b is not None)])
        if now - latest < timeout_s:
            return
        asked = ask_for_dumps(self.setup.paths, self.channel, "stall")
        self._handled = asked
        self.dump("stall")
        dumps = gather_dumps(self.setup.paths, self.channel, range(world), asked, DUMP_WAIT_STALL_S)
        found = diagnose(dumps, world)
        text = (f"stall: no rank completed a collective or a progress step for {now - latest:.0f} s "
                f"(launcher.stall_timeout_s={timeout_s:g})" + (f": {found.text}" if found else ""))
        write_diagnosis(self.setup.paths, "stall", text, found.document() if found else None)
        _end_rank(self.setup, text)


def _end_rank(setup: RankSetup, text: str) -> None:
    """Record the stall as this rank's failure and end its process at once: its host agent (or, for a task
    per process, its scheduler) then stops the others, as for any failed rank."""
    print(text, file=sys.stderr, flush=True)
    setup.outcome.record_error(setup.error_record(StallError(text)))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


class StallError(Exception):
    """No rank completed a collective or a progress step for launcher.stall_timeout_s."""
