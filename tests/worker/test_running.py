"""runner.worker.running: one attempt's ranks as its monitor, executor and diagnostics see them; and the fakes the
tests of those use (ranks that record what they were sent, a relay that holds their lives), no process started."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from runner.records.paths import RunPaths
from runner.spec.schema import JobConfig
from runner.worker.channel import JobChannel
from runner.worker.rank_life import RankLife
from runner.worker.running import Running
from test_preparation import plan_of, setups_of, two_hosts

pytestmark = pytest.mark.unit


@dataclass
class Rank:
    """A rank's process as the agent sees it (runner.worker.zygote.RankProcess), without one: what it was sent while
    it ran, and the exit status the zygote will say (``ends_with``)."""

    index: int
    pid: int = 4000
    code: int | None = None
    ends_with: int | None = None
    signalled: list[tuple[int, bool]] = field(default_factory=list)

    def send(self, signum: int, group: bool = False) -> None:
        if self.code is None:  # as RankProcess: an exited rank is sent nothing
            self.signalled.append((signum, group))

    def reap(self) -> int | None:
        if self.code is None:
            self.code = self.ends_with
        return self.code


@dataclass
class Relay:
    """The output relay's part the agent reads: each rank's life, until its pipes are drained."""

    lives: dict[int, RankLife] = field(default_factory=dict)
    drained: list[int] = field(default_factory=list)

    def life(self, index: int) -> RankLife | None:
        return None if index in self.drained else self.lives.get(index)

    def drain(self, index: int) -> None:
        self.drained.append(index)


def running_of(paths: RunPaths, node_rank: int = 1, *, spec: JobConfig | None = None,
               channel: JobChannel | None = None, lives: dict[int, RankLife] | None = None) -> Running:
    """Host ``node_rank``'s running attempt of ``spec`` (two hosts of two ranks each), with fake ranks and relay."""
    spec = spec or two_hosts()
    setups = setups_of(spec, paths, node_rank)
    return Running(plan=plan_of(spec, paths), paths=paths, setups=tuple(setups),
                   ranks=tuple(Rank(i, pid=4000 + i) for i in range(len(setups))), relay=Relay(dict(lives or {})),
                   channel=channel, node_rank=node_rank, serves=node_rank == 0)  # type: ignore[arg-type]


def test_a_rank_process_is_named_by_its_global_rank(paths) -> None:
    running = running_of(paths, 1)
    assert [running.number(r) for r in running.ranks] == [2, 3]
    assert running.by_number() == {2: running.ranks[0], 3: running.ranks[1]}


def test_the_host_is_named_as_its_ranks_place_says_or_by_its_node_without_ranks(paths) -> None:
    assert running_of(paths, 1).host == "b"
    empty = running_of(paths, 0)
    assert Running(plan=empty.plan, paths=paths, setups=(), ranks=(), relay=empty.relay, channel=None, node_rank=3,
                   serves=False).host == "node 3"  # type: ignore[arg-type]
