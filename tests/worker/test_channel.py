"""runner.worker.channel: what one host's end of the job's channel says, every other end reads back — on host 0's
TCPStore and in an init=file folder alike; a channel that went away reads as empty and takes words without raising.
The folder's cases are unit tests; a TCPStore is torch's (torch.distributed), imported where one is made."""

from __future__ import annotations

import datetime
import shutil
import signal
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from runner.records.dumps import Collective, GroupRecord, RankDump
from runner.records.paths import RunPaths
from runner.records.watch_files import RankWatchFiles, last_request, requested_since
from runner.spec.schema import InitConfig, InitMethod
from runner.worker.channel import (
    ChannelError,
    FolderKeyValue,
    JobChannel,
    KeyValue,
    StoreKeyValue,
    ask_for_dumps,
    channel_of,
    gather_dumps,
)
from runner.worker.channel_records import DumpRequest, JobFailure, RankEnding, StopAsked

LOCAL = "127.0.0.1"
REACH_S = 10.0  # a TCPStore client here may stall for seconds before it connects (see host0_store): reach retries


def serve() -> Any:
    """Host 0's store, in this process, on a port the OS picks."""
    import torch.distributed as dist

    return dist.TCPStore(LOCAL, 0, None, True, datetime.timedelta(seconds=2), wait_for_workers=False)


@pytest.fixture(scope="module")
def host0_store() -> Iterator[tuple[Any, Any]]:
    """One store for the module, and one other host's connection to it: a new TCPStore connection on loopback now
    and then stalls for seconds, so the tests open few, and each keeps to keys of its own (a PrefixStore)."""
    import torch.distributed as dist

    served = serve()
    yield served, dist.TCPStore(LOCAL, served.port, None, False, datetime.timedelta(seconds=REACH_S),
                                wait_for_workers=False)


@dataclass
class Ends:
    """Two ends of one job's channel, and its keys as they lie (for values no end of the channel writes)."""

    host0: JobChannel  # host 0's agent: the store it serves, or the folder
    other: JobChannel  # another host: its own connection to that store, or the same folder
    keys: KeyValue


BACKINGS = ["store", pytest.param("folder", marks=pytest.mark.unit)]


@pytest.fixture(params=BACKINGS)
def ends(request, tmp_path) -> Ends:
    if request.param == "store":
        import torch.distributed as dist

        served, client = request.getfixturevalue("host0_store")
        own = request.node.name  # this test's keys only
        return Ends(JobChannel.served(dist.PrefixStore(own, served)),
                    JobChannel(StoreKeyValue(dist.PrefixStore(own, client))),
                    StoreKeyValue(dist.PrefixStore(own, served)))
    folder = tmp_path / "shared" / "r1.job"
    return Ends(JobChannel.in_folder(folder), JobChannel.in_folder(folder), FolderKeyValue(folder))


def sent(channel: JobChannel) -> None:
    """``channel`` once what it said is in the store: a TCPStore client's set goes unanswered, and another
    connection's question may reach the store first; a question on the writer's own connection is answered after
    its sets. (A folder's files are there when written.)"""
    channel.attempt()


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A port of 127.0.0.1 this process holds and nobody listens on: a connection to it is refused at once."""
    with socket.socket() as held:
        held.bind((LOCAL, 0))
        yield held.getsockname()[1]


def everything(channel: JobChannel) -> dict[str, Any]:
    """What ``channel`` reads of attempt 0 and ranks 0, 1."""
    return {"attempt": channel.attempt(), "failure": channel.failure(0), "stop": channel.stop_requested(),
            "stop told": channel.stop_told(), "joined": channel.joined(0, range(2)),
            "dump request": channel.dump_request(), "dump": channel.dump(1), "beat": channel.beat(1),
            "ended": channel.ended(0, 1)}


NOTHING = {"attempt": None, "failure": None, "stop": None, "stop told": False, "joined": [], "dump request": None,
           "dump": None, "beat": None, "ended": None}


ENDED = RankEnding(host="b", code=0, stopped=False, error=None, returned=None, joined=None, end_dump=None)


def say_everything(channel: JobChannel) -> None:
    channel.open_attempt(0)
    channel.say_failed(0, JobFailure(rank=1, host="b", text="RuntimeError: boom"))
    channel.request_stop(signal.SIGTERM, "b")
    channel.say_stop_told(10.0)
    channel.say_joined(0, 1)
    channel.request_dumps_at(10.0, "stop")
    channel.put_dump(1, {"rank": 1})
    channel.put_beat(1, 9.5)
    channel.say_ended(0, 1, ENDED)


def a_dump(rank: int, at: float, reason: str = "request") -> RankDump:
    return RankDump(rank, "b", at, reason, "runner counter",
                    (GroupRecord("0", 7, 6, (Collective(7, "all_reduce", ((4, 2),), ("torch.float32",), at - 0.5),)),),
                    "train.py:57 in main")


def run_paths(tmp_path) -> RunPaths:
    paths = RunPaths(tmp_path / "a", "r1", 0)
    paths.make()
    return paths


# -- what one end says, the other reads (both backings) -----------------------------------------------------------


def test_a_channel_nobody_wrote_to_says_nothing(ends) -> None:
    assert everything(ends.other) == everything(ends.host0) == NOTHING


def test_everything_one_end_says_the_other_reads(ends) -> None:
    before = time.time()
    say_everything(ends.host0)
    sent(ends.host0)
    after = time.time()
    seen = everything(ends.other)
    assert before <= seen["failure"].time <= after and before <= seen["stop"].time <= after
    assert seen == {"attempt": 0, "failure": JobFailure(rank=1, host="b", text="RuntimeError: boom",
                                                        time=seen["failure"].time),
                    "stop": StopAsked(signal=15, host="b", time=seen["stop"].time), "stop told": True,
                    "joined": [1], "dump request": DumpRequest(time=10.0, reason="stop"), "dump": {"rank": 1},
                    "beat": 9.5, "ended": ENDED}


def test_the_attempt_read_is_the_last_host_0_opened(ends) -> None:
    ends.host0.open_attempt(0)
    ends.host0.open_attempt(3)
    sent(ends.host0)
    assert ends.other.attempt() == 3


def test_the_first_failure_of_an_attempt_is_kept_and_each_attempt_has_its_own(ends) -> None:
    ends.other.say_failed(0, JobFailure(rank=3, host="b", text="RuntimeError: boom"))
    ends.host0.say_failed(0, JobFailure(rank=1, host="a", text="ValueError: later"))  # another host's, after
    ends.host0.say_failed(1, JobFailure(rank=None, host="a", text="host a lost its GPU"))  # the host itself, next
    first, next_attempt = ends.host0.failure(0), ends.other.failure(1)
    assert first == JobFailure(rank=3, host="b", text="RuntimeError: boom", time=first.time)
    assert next_attempt == JobFailure(rank=None, host="a", text="host a lost its GPU", time=next_attempt.time)
    assert first.time <= next_attempt.time and ends.other.failure(2) is None


def test_a_stop_is_read_with_its_signal_and_host_and_told_apart_from_its_dumps_being_told(ends) -> None:
    before = time.time()
    ends.other.request_stop(signal.SIGINT, "b")
    sent(ends.other)
    stop = ends.host0.stop_requested()
    assert stop == StopAsked(signal=2, host="b", time=stop.time) and before <= stop.time <= time.time()
    assert not ends.other.stop_told()
    ends.host0.say_stop_told(stop.time)
    sent(ends.host0)
    assert ends.other.stop_told() and ends.other.stop_requested() == stop


def test_joined_names_the_ranks_that_joined_each_attempt(ends) -> None:
    for attempt, rank in ((0, 3), (0, 1), (1, 0), (0, 9)):
        ends.other.say_joined(attempt, rank)
    sent(ends.other)
    assert ends.host0.joined(0, range(4)) == [1, 3]
    assert ends.host0.joined(1, range(4)) == [0]
    assert ends.host0.joined(2, range(4)) == []


def test_a_request_for_dumps_and_each_ranks_answer_cross_to_the_other_end(ends) -> None:
    ends.host0.request_dumps_at(100.25, "stall")
    dump = a_dump(2, 100.5)
    ends.other.put_dump(2, dump.document())
    sent(ends.host0)
    sent(ends.other)
    assert ends.other.dump_request() == DumpRequest(time=100.25, reason="stall")
    assert RankDump.from_document(ends.host0.dump(2)) == dump
    assert ends.host0.dump(3) is None
    ends.host0.request_dumps_at(200.0, "stop")  # a later request replaces it
    sent(ends.host0)
    assert ends.other.dump_request() == DumpRequest(time=200.0, reason="stop")


def test_a_ranks_beat_reads_as_the_last_time_it_put_as_a_float(ends) -> None:
    ends.other.put_beat(1, 1234.5)
    ends.other.put_beat(1, 1240.25)
    ends.other.put_beat(2, 7)
    sent(ends.other)
    assert (ends.host0.beat(1), ends.host0.beat(0)) == (1240.25, None)
    assert ends.host0.beat(2) == 7.0 and type(ends.host0.beat(2)) is float


def test_a_ranks_ending_is_read_for_its_own_attempt_and_rank_only(ends) -> None:
    record = RankEnding(host="b", code=-9, stopped=False, error=None, returned=None, joined="gloo", end_dump=None)
    ends.other.say_ended(1, 2, record)
    sent(ends.other)
    assert ends.host0.ended(1, 2) == record
    assert ends.host0.ended(0, 2) is None and ends.host0.ended(1, 3) is None


def test_host_0s_report_of_an_attempt_and_who_heard_it_are_read_for_that_attempt(ends) -> None:
    """Where the tasks end together (mpirun): the others wait for host 0's word that it reported the attempt, and
    say they heard it, each named by its first rank."""
    assert not ends.other.reported(1) and ends.host0.left(1, [1, 2]) == []
    ends.host0.say_reported(1)
    sent(ends.host0)
    assert ends.other.reported(1) and not ends.other.reported(0)
    ends.other.say_left(1, 2)
    sent(ends.other)
    assert ends.host0.left(1, [1, 2]) == [2] and ends.host0.left(0, [1, 2]) == []


def test_values_not_json_or_of_another_shape_read_as_nothing(ends) -> None:
    for key, value in (("attempt", b'"0"'), ("failed/0", b"[1, 2]"), ("stop", b""), ("stop/told", b"{torn"),
                       ("joined/0/0", b"false"), ("joined/0/1", b"null"), ("dumps/request", b"3"), ("dumps/1", b'"x"'),
                       ("beat/1", b'"soon"'), ("ended/0/1", b"[]")):
        ends.keys.set(key, value)
    sent(ends.host0)
    assert everything(ends.other) == NOTHING
    assert ends.keys.get("attempt") == b'"0"'  # they are there: read, and not taken


# -- a channel that went away -----------------------------------------------------------------------------------


@pytest.mark.parametrize("backing", BACKINGS)
def test_a_channel_whose_store_went_away_reads_as_empty_and_takes_words_without_raising(backing, tmp_path) -> None:
    if backing == "store":
        served = serve()
        host0, other = JobChannel.served(served), JobChannel.reach(LOCAL, served.port, REACH_S)
    else:
        folder = tmp_path / "shared" / "r1.job"
        host0, other = JobChannel.in_folder(folder), JobChannel.in_folder(folder)
    say_everything(host0)
    sent(host0)
    assert everything(other)["ended"] == ENDED  # it was there

    if backing == "store":
        del host0, served  # host 0's agent finished: its store's server with it (the last reference: no cycle)
    else:
        shutil.rmtree(folder)

    assert everything(other) == NOTHING
    say_everything(other)  # nobody is left to tell: no exception
    assert everything(other) == NOTHING
    if backing == "store":  # nobody is left to report: a task waits no longer for host 0's word
        assert other.reported(0)


# -- reaching host 0's store --------------------------------------------------------------------------------------


def test_reach_names_the_store_it_cannot_reach_and_why(refused_port) -> None:
    with pytest.raises(ChannelError) as raised:
        JobChannel.reach(LOCAL, refused_port, 0.0)
    assert str(raised.value) == (f"host 0's store at 127.0.0.1:{refused_port} cannot be reached (Connection refused) "
                                 "within 0 s; is host 0's `run` running?")


def test_reach_attempt_joins_the_attempt_host_0_is_in_even_a_later_one(host0_store) -> None:
    served, _ = host0_store
    host0 = JobChannel.served(served)
    host0.open_attempt(2)  # this host was started again while the others went on to attempt 2
    host0.say_failed(2, JobFailure(rank=0, host="a", text="RuntimeError: boom"))
    sent(host0)
    channel, attempt = JobChannel.reach_attempt(LOCAL, served.port, 1, REACH_S)
    assert attempt == 2 and channel.failure(2).text == "RuntimeError: boom"


def test_reach_attempt_refuses_a_store_that_has_not_opened_the_attempt_in_time(host0_store) -> None:
    served, _ = host0_store
    host0 = JobChannel.served(served)
    host0.open_attempt(0)
    sent(host0)
    with pytest.raises(ChannelError) as raised:
        JobChannel.reach_attempt(LOCAL, served.port, 5, 0.0)  # one look: still in the earlier attempt
    assert str(raised.value) == (f"host 0's store at 127.0.0.1:{served.port} did not open attempt 6 within 0 s; is "
                                 "host 0's `run` still running?")


# -- a rank's end: channel_of -------------------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize("init_dir", ["shared", None], ids=["in init.dir", "in the run folder"])
def test_a_file_init_job_gets_the_private_folder_every_host_sees(tmp_path, init_dir) -> None:
    paths = run_paths(tmp_path)
    shared = str(tmp_path / init_dir) if init_dir else None
    folder = (tmp_path / "shared" if init_dir else paths.root) / "r1.job"
    channel = channel_of(paths, InitConfig(method=InitMethod.file, dir=shared), LOCAL, "1", 0.0)  # (no address asked)
    assert channel is not None
    channel.put_beat(3, 5.5)
    assert JobChannel.in_folder(folder).beat(3) == 5.5
    assert folder.stat().st_mode & 0o777 == 0o700


def test_a_rank_reaches_host_0s_store_at_its_address_and_port(tmp_path, host0_store) -> None:
    served, _ = host0_store
    host0 = JobChannel.served(served)
    host0.put_beat(12, 77.5)
    sent(host0)
    channel = channel_of(run_paths(tmp_path), InitConfig(), LOCAL, str(served.port), REACH_S)
    assert channel is not None and channel.beat(12) == 77.5


@pytest.mark.parametrize("addr, port", [pytest.param(None, "29500", marks=pytest.mark.unit),
                                        pytest.param(LOCAL, None, marks=pytest.mark.unit),
                                        pytest.param(LOCAL, "", marks=pytest.mark.unit),
                                        pytest.param(LOCAL, "29x", marks=pytest.mark.unit), (LOCAL, "refused")],
                         ids=["no address", "no port", "an empty port", "a port not a number", "nobody listening"])
def test_a_rank_without_a_store_to_reach_has_no_channel(tmp_path, refused_port, addr, port) -> None:
    port = str(refused_port) if port == "refused" else port
    assert channel_of(run_paths(tmp_path), InitConfig(), addr, port, 0.0) is None


# -- dumps: the channel and the run folder --------------------------------------------------------------------------


def test_a_request_for_dumps_goes_on_the_channel_and_in_the_run_folder(ends, tmp_path) -> None:
    paths = run_paths(tmp_path)
    before = time.time()
    asked = ask_for_dumps(paths, ends.host0, "stall")
    assert before <= asked <= time.time()
    sent(ends.host0)
    assert ends.other.dump_request() == DumpRequest(time=asked, reason="stall")
    assert last_request(paths) == asked and requested_since(paths, asked - 1.0) == "stall"


@pytest.mark.unit
def test_a_request_for_dumps_without_a_channel_is_the_run_folders_only(tmp_path) -> None:
    paths = run_paths(tmp_path)
    asked = ask_for_dumps(paths, None, "stop")
    assert last_request(paths) == asked and requested_since(paths, asked - 1.0) == "stop"


def test_dumps_are_gathered_from_the_channel_or_the_run_folder_and_only_fresh_ones(ends, tmp_path) -> None:
    paths = run_paths(tmp_path)
    since = 1000.0
    on_channel, in_folder, fresh_in_folder = a_dump(0, 1000.5), a_dump(1, 1001.0), a_dump(3, 1000.0)
    ends.other.put_dump(0, on_channel.document())  # a rank of another host
    RankWatchFiles(paths, 1).write_dump(in_folder)  # a rank of this host, without the channel
    ends.other.put_dump(2, a_dump(2, 999.0).document())  # an answer to an earlier request
    ends.other.put_dump(3, a_dump(3, 998.0).document())  # stale on the channel, fresh in the run folder
    RankWatchFiles(paths, 3).write_dump(fresh_in_folder)
    sent(ends.other)

    assert gather_dumps(paths, ends.host0, range(4), since) == {0: on_channel, 1: in_folder, 3: fresh_in_folder}
    assert gather_dumps(paths, None, range(4), since) == {1: in_folder, 3: fresh_in_folder}


@pytest.mark.unit
def test_a_first_word_in_a_folder_is_a_whole_file_and_leaves_nothing_else(tmp_path) -> None:
    """A key set first is written under a name of its own and linked: a reader never sees it half written, a
    writer that dies midway leaves no empty key that would take the place of a later first word."""
    kv = FolderKeyValue(tmp_path / "channel")
    assert kv.first("failed/0", b'{"rank": 1}') and not kv.first("failed/0", b'{"rank": 2}')
    assert kv.get("failed/0") == b'{"rank": 1}'
    assert sorted(p.name for p in (tmp_path / "channel").iterdir()) == ["failed__0"]
