"""The record of a job's hosts changing (runner.spec.elastic): ``membership.jsonl`` in the run folder, one
:class:`MembershipChange` a line, written by the launch that started the job again on the hosts that remain
(runner.launchers.elastic.membership) and read by the run's summary."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from runner.records.json_lines import append_document, documents
from runner.records.paths import RunPaths


@dataclass(frozen=True, kw_only=True)
class MembershipChange:
    """One change of the job's hosts: the attempt that a lost host ended (or that stopped at a checkpoint for a lost
    host that answers again to join), and the next one on the hosts after."""

    time: float  # when the loss was seen, or the host that joins answered (wall clock of the launching machine)
    attempt: int  # the attempt the loss (or the stop for a join) ended (counted from 0, as TORCHELASTIC_RESTART_COUNT and the ranks' ctx.attempt)
    next_attempt: int | None  # the attempt started on ``after``; None: the job ended with this change
    before: tuple[str, ...]  # the hosts, in node-rank order
    after: tuple[str, ...]  # the hosts of the next attempt, in node-rank order (empty: none)
    lost: tuple[str, ...]  # the hosts lost
    cause: str  # which host, and how it was seen ("ssh exited 255 (Timeout, server b not responding.)")
    spares: tuple[str, ...] = ()  # the spares that took a lost host's place
    joined: tuple[str, ...] = ()  # lost hosts taken back (they answered again: topology.max_nodes)
    world_size_before: int = 0
    world_size_after: int = 0
    last_step: int | None = None  # rank 0's last step before the loss, as its host last said it
    resumed_from: int | None = None  # the step the next attempt started at (its checkpoint's)
    resumed_from_host: str | None = None  # the host whose copy of the checkpoint it was (runner.training.copies)
    resumed_from_save: int | None = None  # that copy's sequence among the run's saves
    to_first_step_s: float | None = None  # seconds from the loss seen to the next attempt's first step

    @property
    def steps_lost(self) -> int | None:
        """The steps taken since the checkpoint the next attempt resumed from (they are taken again)."""
        if self.last_step is None or self.resumed_from is None:
            return None
        return max(0, self.last_step - self.resumed_from)

    def document(self) -> dict:
        return {**asdict(self), "steps_lost": self.steps_lost}

    @classmethod
    def from_document(cls, doc: object) -> MembershipChange | None:
        if not isinstance(doc, dict):
            return None
        names = {f.name for f in fields(cls)}
        try:
            found = {k: v for k, v in doc.items() if k in names}
            for k in ("before", "after", "lost", "spares", "joined"):
                if k in found:
                    found[k] = tuple(found[k])
            return cls(**found)
        except TypeError:
            return None

    def line(self) -> str:
        """The summary's words, attempts counted from 1 as `run`'s restart lines count them: "c lost in attempt 1
        (...): attempt 2 on 2 host(s), world size 2; 17 step(s) lost, first step 6.2 s after"; "c taken in after attempt 2
        (...): attempt 3 on 3 host(s), world size 3; 0 step(s) lost, first step 5.1 s after"."""
        then = f"attempt {self.next_attempt + 1} on {len(self.after)} host(s), world size {self.world_size_after}" \
            if self.next_attempt is not None else "the job ended"
        spares = f", spare {', '.join(self.spares)} in its place" if self.spares else ""
        lost = f"; {self.steps_lost} step(s) lost" if self.steps_lost is not None else ""
        first = f", first step {self.to_first_step_s:.1f} s after" if self.to_first_step_s is not None else ""
        when = f"in attempt {self.attempt + 1}" if self.lost else f"after attempt {self.attempt + 1}"
        what = " and ".join(part for part in (f"{', '.join(self.lost)} lost" if self.lost else "",
                                              f"{', '.join(self.joined)} taken in" if self.joined else "") if part)
        return f"{what} {when} ({self.cause}): {then}{spares}{lost}{first}"


def append_change(paths: RunPaths, change: MembershipChange) -> None:
    """Add ``change`` to the run folder's membership.jsonl."""
    append_document(paths.membership, change.document())


def changes(paths: RunPaths) -> list[MembershipChange]:
    """The changes recorded so far, in order (none: no file)."""
    found = (MembershipChange.from_document(doc) for doc in documents(paths.membership))
    return [change for change in found if change is not None]
