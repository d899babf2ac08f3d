"""runner.worker.endings: each host agent puts its ranks' records on the job's channel, and host 0's writes the other
hosts' (or a word that they are gone) into its own run folder; another host's failure is recorded there too."""

from __future__ import annotations

import json
import time
import dataclasses

import pytest

from conftest import make_spec, validate
from runner.environments.process import ProcessEnvironment
from runner.launchers import plan_for
from runner.plan.processes import Plan
from runner.records.dumps import Collective, GroupRecord, RankDump
from runner.records.outcomes import ErrorRecord, RankOutcome
from runner.records.paths import RunPaths
from runner.records.watch_files import RankWatchFiles
from runner.spec.job import Job
from runner.spec.schema import BackendConfig
from runner.worker.channel import JobChannel
from runner.worker.channel_records import JobFailure
from runner.worker.endings import gather_endings, peer_failure, share_ended
from runner.worker.failures import silent_end
from runner.worker.preparation import rank_setups
from runner.worker.host_ending import HostEnding
from runner.worker.rendezvous import Rendezvous
from runner.worker.setup import RankSetup

pytestmark = pytest.mark.unit

RESULT = {"loss": 0.25, "steps": 40}


@pytest.fixture(scope="module")
def job() -> Job:
    """Two hosts, a (ranks 0, 1) and b (ranks 2, 3), started by hand: each has its own run folder."""
    got = validate(make_spec(devices=[2, 2], names=["a", "b"], addrs=["127.0.0.1", "127.0.0.2"], launcher="manual",
                             backend=BackendConfig(pick_interface=False)))  # no routes asked: no network here
    assert got.valid, got.rendered()
    return got.job


def host_paths(tmp_path, host: str, attempt: int = 0) -> RunPaths:
    paths = RunPaths(tmp_path / host, "r1", attempt)
    paths.make()
    return paths


def shared_channel(tmp_path) -> JobChannel:
    """The channel of an init=file job: a folder in init.dir, which both hosts see."""
    return JobChannel.in_folder(RunPaths(tmp_path / "a", "r1").channel_folder(str(tmp_path / "shared")))


def host_b(job: Job, tmp_path) -> tuple[Plan, RunPaths, list[RankSetup]]:
    paths = host_paths(tmp_path, "b")
    plan = plan_for(job, paths)
    return plan, paths, rank_setups(plan, 1, Rendezvous("env://", "29500", True), paths, ProcessEnvironment.read({}))


def end_dump(rank: int, reason: str = "end") -> RankDump:
    return RankDump(rank, "b", 1000.0, reason, "runner counter",
                    (GroupRecord("0", 7, -1, (Collective(7, "all_reduce", ((4, 2),), ("torch.float32",), 999.5),)),),
                    "train.py:57 in main")


def seen(rank: int, local_rank: int, host: str, at: float, text: str, killed: bool = True) -> ErrorRecord:
    """A rank's record as an agent (or a peer's word) wrote it: no machine, no pid."""
    return ErrorRecord(rank=rank, local_rank=local_rank, host=host, machine=None, pid=None, timestamp=at,
                       exception=text, killed=killed)


def files_of(paths: RunPaths, rank: int) -> list[str]:
    return sorted(p.name for p in paths.logs.glob(f"rank{rank:05d}.*"))


def b_ends_with_a_return_and_a_kill(paths: RunPaths, setups: list[RankSetup]) -> HostEnding:
    """Rank 2 joined, returned RESULT and wrote its end dump; rank 3 joined, wrote only a requested dump, and was
    killed by SIGKILL at 1234.5 without a word."""
    setups[0].outcome.mark_joined("gloo")
    setups[0].outcome.mark_done(False, RESULT)
    RankWatchFiles(paths, 2).write_dump(end_dump(2))
    setups[1].outcome.mark_joined("gloo")
    RankWatchFiles(paths, 3).write_dump(end_dump(3, "request"))
    return HostEnding(codes={2: 0, 3: -9}, order=[3, 2], ended_at={2: 1230.0, 3: 1234.5})


def test_each_ranks_record_on_the_channel_is_its_outcome_as_its_host_saw_it(job, tmp_path) -> None:
    _, paths, setups = host_b(job, tmp_path)
    channel = shared_channel(tmp_path)
    share_ended(channel, paths, setups, b_ends_with_a_return_and_a_kill(paths, setups))
    assert channel.ended(0, 2).document() == {"host": "b", "code": 0, "stopped": False, "error": None,
                                   "done": {"stopped": False, "result": RESULT, "ended": None}, "joined": "gloo",
                                   "end_dump": json.loads(json.dumps(end_dump(2).document()))}
    killed = ErrorRecord(rank=3, local_rank=1, host="b", machine=None, pid=None, timestamp=1234.5,
                         exception=silent_end(-9), killed=True)
    assert channel.ended(0, 3).document() == {"host": "b", "code": -9, "stopped": False, "error": dataclasses.asdict(killed), "done": None,
                                   "joined": "gloo", "end_dump": None}  # a requested dump is not its end's
    assert channel.ended(0, 0) is None and channel.ended(0, 1) is None and channel.ended(1, 2) is None


def test_a_rank_that_raised_shares_its_own_error_and_a_rank_the_agent_stopped_or_still_running_none(
        job, tmp_path) -> None:
    _, paths, setups = host_b(job, tmp_path)
    channel = shared_channel(tmp_path)
    own = ErrorRecord(rank=2, local_rank=0, host="b", machine="machine-b", pid=4242, timestamp=1100.0,
                      exception="RuntimeError: boom", traceback="Traceback ...\n", timeout=True)
    setups[0].outcome.record_error(own)
    share_ended(channel, paths, setups, HostEnding(codes={2: 1, 3: -15}, order=[2, 3], stopped={3},
                                                   ended_at={2: 1101.0, 3: 1102.0}))
    assert channel.ended(0, 2).document() == {"host": "b", "code": 1, "stopped": False, "error": dataclasses.asdict(own), "done": None,
                                   "joined": None, "end_dump": None}
    assert channel.ended(0, 3).document() == {"host": "b", "code": -15, "stopped": True, "error": None, "done": None,
                                   "joined": None, "end_dump": None}
    share_ended(channel, paths, setups[1:], HostEnding(codes={}, order=[]))  # its process not seen to end
    assert channel.ended(0, 3).document() == {"host": "b", "code": None, "stopped": False, "error": None, "done": None,
                                   "joined": None, "end_dump": None}


def test_a_rank_that_exited_0_without_returning_shares_no_error(job, tmp_path) -> None:
    _, paths, setups = host_b(job, tmp_path)
    channel = shared_channel(tmp_path)
    share_ended(channel, paths, setups[:1], HostEnding(codes={2: 0}, order=[2]))
    assert channel.ended(0, 2).document() == {"host": "b", "code": 0, "stopped": False, "error": None, "done": None,
                                   "joined": None, "end_dump": None}


def test_a_torn_done_file_is_shared_as_a_return_with_nothing_said(job, tmp_path) -> None:
    _, paths, setups = host_b(job, tmp_path)
    setups[0].outcome.done_file.write_text('{"stopped": tr')  # cut short as it was written
    channel = shared_channel(tmp_path)
    share_ended(channel, paths, setups[:1], HostEnding(codes={2: 0}, order=[2]))
    assert channel.ended(0, 2).document() == {"host": "b", "code": 0, "stopped": False, "error": None,
                                   "done": {"stopped": False, "result": {}, "ended": None}, "joined": None, "end_dump": None}


def test_host_0_writes_the_other_hosts_records_into_its_run_folder(job, tmp_path) -> None:
    plan, b_paths, setups = host_b(job, tmp_path)
    channel = shared_channel(tmp_path)
    share_ended(channel, b_paths, setups, b_ends_with_a_return_and_a_kill(b_paths, setups))
    a_paths = host_paths(tmp_path, "a")

    assert gather_endings(channel, a_paths, plan, {0, 1}, wait_s=5.0) == []

    two, three = RankOutcome(a_paths, 2), RankOutcome(a_paths, 3)
    assert (two.backend, two.done, two.returned_on_request, two.result, two.error()) == ("gloo", True, False, RESULT,
                                                                                        None)
    assert RankWatchFiles(a_paths, 2).dump() == end_dump(2)
    assert two.done_file.read_text() == RankOutcome(b_paths, 2).done_file.read_text()
    assert (three.backend, three.done, three.error()) == ("gloo", False, seen(3, 1, "b", 1234.5, silent_end(-9)))
    assert files_of(a_paths, 2) == ["rank00002.collectives.json", "rank00002.done", "rank00002.joined"]
    assert files_of(a_paths, 3) == ["rank00003.error.json", "rank00003.joined"]  # not its requested dump
    assert files_of(a_paths, 0) == files_of(a_paths, 1) == []  # host 0's own ranks are its own


def test_a_record_replaces_an_earlier_attempts_files_of_its_rank(job, tmp_path) -> None:
    plan, b_paths, setups = host_b(job, tmp_path)
    channel = shared_channel(tmp_path)
    a_paths = host_paths(tmp_path, "a")
    earlier = RankOutcome(a_paths, 3)
    earlier.mark_joined("nccl")
    earlier.mark_done(True, {"old": 1})
    share_ended(channel, b_paths, setups, HostEnding(codes={2: 0, 3: -9}, order=[3, 2], ended_at={3: 50.0}))

    assert gather_endings(channel, a_paths, plan, {0, 1}, wait_s=5.0) == []

    assert files_of(a_paths, 3) == ["rank00003.error.json"]
    assert earlier.error() == seen(3, 1, "b", 50.0, silent_end(-9))


def test_ranks_of_a_host_that_never_says_are_recorded_gone_once_wait_s_is_over(job, tmp_path) -> None:
    a_paths = host_paths(tmp_path, "a")
    plan = plan_for(job, a_paths)
    RankOutcome(a_paths, 2).mark_joined("gloo")  # an earlier attempt's files of rank 2: gone with the new record
    RankOutcome(a_paths, 2).mark_done(stopped=False)
    before = time.time()

    assert gather_endings(shared_channel(tmp_path), a_paths, plan, [0, 1], wait_s=0.05) == [2, 3]

    after = time.time()
    for rank, local_rank in ((2, 0), (3, 1)):
        error = RankOutcome(a_paths, rank).error()
        assert error is not None and before <= error.timestamp <= after
        assert error == seen(rank, local_rank, "b", error.timestamp,
                             "no word from its host b within 0.05 s of the end (its agent gone?)")
        assert files_of(a_paths, rank) == [f"rank{rank:05d}.error.json"]
    assert files_of(a_paths, 0) == files_of(a_paths, 1) == []


def test_records_of_another_attempt_are_not_taken(job, tmp_path) -> None:
    plan, b_paths, setups = host_b(job, tmp_path)
    channel = shared_channel(tmp_path)
    share_ended(channel, b_paths, setups, b_ends_with_a_return_and_a_kill(b_paths, setups))  # attempt 0
    a_paths = host_paths(tmp_path, "a", attempt=1)

    assert gather_endings(channel, a_paths, plan, {0, 1}, wait_s=0.05) == [2, 3]

    assert [RankOutcome(a_paths, r).error().exception for r in (2, 3)] == \
        ["no word from its host b within 0.05 s of the end (its agent gone?)"] * 2
    assert not RankOutcome(a_paths, 2).done and not RankOutcome(a_paths, 2).joined


@pytest.mark.timeout(10)  # a host known gone is not waited for: wait_s=60 would run past this
def test_a_host_known_gone_is_not_waited_for_and_what_it_said_before_is_kept(job, tmp_path) -> None:
    plan, b_paths, setups = host_b(job, tmp_path)
    channel = shared_channel(tmp_path)
    setups[0].outcome.mark_done(True, {})
    share_ended(channel, b_paths, setups[:1], HostEnding(codes={2: 0}, order=[2]))  # rank 2 said, then b was lost
    a_paths = host_paths(tmp_path, "a")
    before = time.time()

    assert gather_endings(channel, a_paths, plan, {0, 1}, wait_s=60.0, gone={"b": "ssh: connection lost"}) == [3]

    two, three = RankOutcome(a_paths, 2), RankOutcome(a_paths, 3)
    assert (two.done, two.returned_on_request, two.result, two.error()) == (True, True, {}, None)
    error = three.error()
    assert error is not None and before <= error.timestamp <= time.time()
    assert error == seen(3, 1, "b", error.timestamp, "its host b is gone: ssh: connection lost")


class _FoundGoneWhileWaiting(dict):
    """The watch's mapping of hosts found gone, as host 0's wait reads it: empty for the wait's first look, then
    holding ``host`` (as if the watch's thread had found it meanwhile): the order of events, without a timer."""

    def __init__(self, host: str, why: str) -> None:
        super().__init__()
        self.host, self.why, self.looks_before = host, why, 0

    def __contains__(self, key: object) -> bool:
        if not dict.__contains__(self, self.host):
            self.looks_before += 1
            if self.looks_before > 1:
                self[self.host] = self.why
        return dict.__contains__(self, key)


@pytest.mark.timeout(10)  # wait_s=60: the host found gone while host 0 waits ends the wait
def test_a_host_found_gone_while_host_0_waits_ends_the_wait(job, tmp_path) -> None:
    """launcher=manual's watch finds a host lost after host 0 began to wait (an empty mapping then, filled in by the
    watch's thread): the wait ends once it is there, not after wait_s."""
    plan, _, _ = host_b(job, tmp_path)
    channel = shared_channel(tmp_path)
    gone = _FoundGoneWhileWaiting(host="b", why="no answer for 8 s")
    assert gather_endings(channel, host_paths(tmp_path, "a"), plan, {0, 1}, wait_s=60.0, gone=gone,
                          sleep=lambda s: None) == [2, 3]
    assert gone.looks_before > 0  # the wait had begun, and looked, before the host was found gone
    error = RankOutcome(host_paths(tmp_path, "a"), 2).error()
    assert error is not None and error.exception == "its host b is gone: no answer for 8 s", error


def test_a_peer_failure_is_recorded_for_its_rank_as_its_host_said_it(job, tmp_path) -> None:
    a_paths = host_paths(tmp_path, "a")
    peer_failure(a_paths, plan_for(job, a_paths), JobFailure(rank=3, host="b-machine", text="RuntimeError: boom",
                                                             time=100.0))
    assert RankOutcome(a_paths, 3).error() == seen(3, 1, "b-machine", 100.0, "RuntimeError: boom", killed=False)
    assert sorted(p.name for p in a_paths.logs.iterdir()) == ["rank00003.error.json"]


def test_a_peer_failure_without_host_or_time_takes_the_plans_host_and_now(job, tmp_path) -> None:
    a_paths = host_paths(tmp_path, "a")
    before = time.time()
    peer_failure(a_paths, plan_for(job, a_paths), JobFailure(rank=2, host="", text="", time=0.0))
    error = RankOutcome(a_paths, 2).error()
    assert error is not None and before <= error.timestamp <= time.time()
    assert error == seen(2, 0, "b", error.timestamp, "", killed=False)


def test_a_peer_failure_leaves_the_ranks_own_record(job, tmp_path) -> None:
    a_paths = host_paths(tmp_path, "a")
    own = ErrorRecord(rank=2, local_rank=0, host="b", machine="machine-b", pid=4242, timestamp=90.0,
                      exception="ValueError: bad batch", traceback="Traceback ...\n")
    RankOutcome(a_paths, 2).record_error(own)  # a run folder both hosts share
    peer_failure(a_paths, plan_for(job, a_paths), JobFailure(rank=2, host="b", text="ValueError: bad batch", time=91.0))
    assert RankOutcome(a_paths, 2).error() == own


@pytest.mark.parametrize("rank", [None, 4, -1, "2", 2.0], ids=["a host itself", "past the world", "negative",
                                                              "a string", "a float"])
def test_a_peer_failure_of_no_rank_of_the_job_writes_nothing(job, tmp_path, rank) -> None:
    """As the channel's document says it: a rank that is no whole number is none (JobFailure.from_document)."""
    a_paths = host_paths(tmp_path, "a")
    failure = JobFailure.from_document({"rank": rank, "host": "b", "text": "host b lost", "time": 1.0})
    peer_failure(a_paths, plan_for(job, a_paths), failure)
    assert list(a_paths.logs.iterdir()) == []

