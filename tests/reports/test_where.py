"""runner.reports.where: Ctrl-\\ to `run` asks every rank where it is and says it in one paragraph. Here the ranks'
side is a thread that answers the request as a rank's watch does (runner.worker.watch, with real ranks:
test_hangs.py)."""

from __future__ import annotations

import threading
import time

import pytest

from conftest import validate
from runner.launchers import plan_for
from runner.records.dumps import Collective, GroupRecord, RankDump
from runner.records.paths import RunPaths
from runner.records.watch_files import RankWatchFiles, last_request
from runner.reports import where
from runner.worker.channel import JobChannel, where_through
from runs import QUIT_SAID, wait_until

pytestmark = pytest.mark.unit


def answering(paths: RunPaths, dumps: dict[int, tuple[int, str]], channel: JobChannel | None = None
              ) -> threading.Thread:
    """Ranks that, once asked, write where they are: rank -> (the all-reduce it entered last, where it is); with a
    ``channel``, as ranks on another host do: asked and answering through it alone."""
    def answer() -> None:
        asked = (lambda: channel.dump_request() is not None) if channel else (lambda: last_request(paths) is not None)
        wait_until(asked, 10, "the ranks asked")
        for rank, (enqueued, at) in dumps.items():
            entries = tuple(Collective(s, "all_reduce", ((1,),), ("Float",), time.time() - 2) for s in range(1, enqueued + 1))
            dump = RankDump(rank, "node1", time.time(), "request", "runner counter",
                            (GroupRecord("0", enqueued, enqueued - 1, entries),), at)
            if channel is not None:
                channel.put_dump(rank, dump.document())
            else:
                RankWatchFiles(paths, rank).write_dump(dump)

    return threading.Thread(target=answer, daemon=True)


def test_where_the_ranks_are_in_one_paragraph(tmp_path, capsys) -> None:
    paths = RunPaths(tmp_path, "R1")
    paths.make()
    plan = plan_for(validate(("topology=1x3", "device=cpu", "recipe.global_batch_size=3")).job, paths)
    ranks = answering(paths, {0: (4, "train.py:20 in main"), 1: (3, "train.py:16 in main"), 2: (4, "train.py:20 in main")})
    ranks.start()
    where.where_the_ranks_are(plan, paths)
    ranks.join()
    err = capsys.readouterr().err
    assert err.startswith("\nwhere the ranks are: ranks 0,2 wait in all_reduce #4 (process group 0) since "), err
    assert "rank 1 never entered it: its last collective was all_reduce #3, and it is at train.py:16 in main" in err
    assert err.endswith("\n    (stacks: logs/rank*.log; the job goes on)\n") and QUIT_SAID in err  # what runs.py waits for


def test_ranks_that_do_not_answer_are_counted(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(where, "DUMP_WAIT_ASKED_S", 0.05)  # nobody answers: the whole wait
    paths = RunPaths(tmp_path, "R1")
    paths.make()
    plan = plan_for(validate(("topology=1x2", "device=cpu", "recipe.global_batch_size=2")).job, paths)
    where.where_the_ranks_are(plan, paths, then="stopping them")
    assert capsys.readouterr().err == ("\nwhere the ranks are: 0 of 2 rank(s) answered, none in a collective yet\n"
                                       "    (stacks: logs/rank*.log; stopping them)\n")
    assert last_request(paths) is not None  # they were asked


def test_an_agent_asks_and_hears_through_the_jobs_channel(tmp_path, capsys) -> None:
    """Host 0's agent under launcher=ssh (runner.worker.host_agent): the ranks of the other host see no folder of
    its, and answer through the job's channel."""
    paths = RunPaths(tmp_path / "host0", "R1")
    paths.make()
    channel = JobChannel.in_folder(tmp_path / "channel")
    plan = plan_for(validate(("topology=1x2", "device=cpu", "recipe.global_batch_size=2")).job, paths)
    ranks = answering(paths, {0: (4, "train.py:20 in main"), 1: (3, "train.py:16 in main")}, channel)
    ranks.start()
    where.where_the_ranks_are(plan, paths, **where_through(channel))
    ranks.join()
    err = capsys.readouterr().err
    assert err.startswith("\nwhere the ranks are: rank 0 waits in all_reduce #4 (process group 0) since "), err
    assert "rank 1 never entered it: its last collective was all_reduce #3, and it is at train.py:16 in main" in err
