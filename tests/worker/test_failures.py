"""runner.worker.failures, without processes: how a host's end is put in words (a success, a stop on request, the
rank that failed first and why, the others after it, a hang) from real rank records in a run folder."""

from __future__ import annotations

import dataclasses
import signal
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import make_spec
from runner.records.dumps import Collective, GroupRecord, RankDump
from runner.records.outcomes import first_failures, ErrorRecord, RankOutcome
from runner.records.paths import RunPaths
from runner.records.watch_files import RankWatchFiles, read_diagnosis, request_dumps, write_diagnosis
from runner.spec.place import RankPlace
from runner.common.formatting import rank_list
from runner.spec.schema import DeviceKind, InitConfig
from runner.worker import failures
from runner.worker.failures import (
    choose_first,
    _hang_summary,
    _last_stack,
    _stopped_status,
    agent_seen_error,
    failure_line,
    report_host_ending,
    silent_end,
)
from runner.worker.host_ending import HostEnding
from runner.worker.relay import Echo
from runner.worker.setup import RankSetup

pytestmark = pytest.mark.unit

OOM_HINT = "killed from outside; the kernel's OOM killer? `dmesg` says"
NATIVE = "a crash in native code (a library's bug, a corrupt tensor, a failed assertion in C++)"
TRACEBACK = ('Traceback (most recent call last):\n  File "/work/train.py", line 12, in main\n    step()\n'
             'RuntimeError: boom\n')
# the head of a host's report whose rank 0 raised first, its traceback not on this terminal
RANK_0_RAISED_FIRST = f"\n== job failed ==\nrank 0 (host node0, local rank 0, pid 4000) failed first:\n\n{TRACEBACK}\n"


def host_setups(paths: RunPaths, n: int = 2, *, world: int | None = None, node: int = 0, shown: tuple[int, ...] = (),
                timeout_s: float = 30.0) -> list[RankSetup]:
    """The setups of host ``node``'s ``n`` ranks of a ``world``-rank CPU job, as the host agent makes them."""
    world = world or n
    spec = make_spec(nodes=world // n, devices_per_node=n, init=InitConfig(timeout_s=timeout_s))
    return [RankSetup(spec=spec, recipe=spec.recipe, recipe_cfg=OmegaConf.create({}),
                      place=RankPlace(global_rank=node * n + i, local_rank=i, node_rank=node, world_size=world,
                                      local_world_size=n, host=f"node{node}", device="cpu", device_ids=()),
                      backend="gloo", device=DeviceKind.cpu, init_method="env://", env={}, paths=paths,
                      stop_signal=signal.SIGTERM, echo=Echo(shown=i in shown))
            for i in range(n)]


def raised(setup: RankSetup, exception: str, at: float, traceback: str = TRACEBACK, timeout: bool = False) -> None:
    """The error record a rank writes when it raises (pid 4000 + its rank)."""
    place = setup.place
    setup.outcome.record_error(ErrorRecord(rank=place.global_rank, local_rank=place.local_rank, host=place.host,
                                           machine="machine0", pid=4000 + place.global_rank, timestamp=at,
                                           exception=exception, traceback=traceback, timeout=timeout))


def report(capsys, ending: HostEnding, setups: list[RankSetup], paths: RunPaths, announce: bool = True
           ) -> tuple[int, str, str]:
    code = report_host_ending(ending, setups, paths, 12.34, announce)
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------------- how a process ended, in words


def test_a_rank_killed_by_sigkill_is_named_by_its_signal_with_the_oom_killer_as_a_suspect() -> None:
    assert silent_end(-signal.SIGKILL) == f"killed by SIGKILL (no Python exception: {OOM_HINT})"


@pytest.mark.parametrize("signum", [signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT])
def test_a_rank_killed_by_a_crash_signal_is_said_to_have_crashed_in_native_code(signum) -> None:
    assert silent_end(-signum) == f"killed by {signum.name} (no Python exception: {NATIVE})"


def test_a_rank_killed_by_another_signal_was_signalled_from_outside() -> None:
    assert silent_end(-signal.SIGTERM) == "killed by SIGTERM (no Python exception: killed by a signal from outside)"


def test_a_signal_without_a_name_is_given_by_its_number() -> None:
    assert silent_end(-40) == "killed by signal 40 (no Python exception: killed by a signal from outside)"


def test_a_rank_that_exited_with_a_status_and_no_error_is_said_to_have_left_without_one() -> None:
    assert silent_end(3) == ("exit status 3 (no Python exception: it exited without one: os._exit, or a crash in "
                             "native code)")


def test_failure_line_is_the_line_of_the_ranks_error_that_says_what_went_wrong(paths) -> None:
    (setup,) = host_setups(paths, 1)
    raised(setup, "RuntimeError: Connection closed by peer\n(more detail on a second line)", 100.0)
    assert failure_line(setup, 1) == "RuntimeError: Connection closed by peer"


def test_failure_line_of_a_script_that_exited_drops_the_scriptexit_prefix(paths) -> None:
    (setup,) = host_setups(paths, 1)
    raised(setup, "ScriptExit: train.py exited with status 2", 100.0, traceback="")
    assert failure_line(setup, 2) == "train.py exited with status 2"


def test_failure_line_of_a_rank_without_an_error_record_is_how_its_process_ended(paths) -> None:
    setup = host_setups(paths, 2)[1]
    assert failure_line(setup, -signal.SIGKILL) == f"killed by SIGKILL (no Python exception: {OOM_HINT})"


def test_the_agents_record_of_a_rank_that_wrote_none_is_marked_killed_and_has_no_pid() -> None:
    place = RankPlace(global_rank=5, local_rank=1, node_rank=2, world_size=8, local_world_size=2, host="gpu3",
                      device="cpu", device_ids=())
    assert agent_seen_error(place, "killed by SIGKILL", ended_at=1234.5) == ErrorRecord(
        rank=5, local_rank=1, host="gpu3", machine=None, pid=None, timestamp=1234.5, exception="killed by SIGKILL",
        traceback="", killed=True, timeout=False)
    before = time.time()
    now = agent_seen_error(place, "killed by SIGKILL").timestamp
    assert before <= now <= time.time()  # no time given: when the agent writes it


# --------------------------------------------------------------------------- a host whose ranks did not fail


def test_a_host_whose_ranks_all_finished_says_so_on_stdout_and_exits_0(paths, capsys) -> None:
    ending = HostEnding(codes={0: 0, 1: 0}, order=[1, 0])
    assert report(capsys, ending, host_setups(paths), paths) == (
        0, f"\nrun finished: 2 process(es) in 12.3 s; outputs in {paths.root}/\n", "")


def test_a_hosts_share_of_a_larger_job_names_its_host(paths, capsys) -> None:
    ending = HostEnding(codes={0: 0, 1: 0}, order=[0, 1])
    assert report(capsys, ending, host_setups(paths, 2, world=6, node=1), paths) == (
        0, f"\nrun finished: 2 process(es) on node1 in 12.3 s; outputs in {paths.root}/\n", "")


def test_without_announce_a_success_prints_nothing(paths, capsys) -> None:
    ending = HostEnding(codes={0: 0, 1: 0}, order=[0, 1])
    assert report(capsys, ending, host_setups(paths), paths, announce=False) == (0, "", "")


def test_a_stop_on_request_says_so_and_exits_with_128_plus_the_signal_that_ended_the_ranks(paths, capsys) -> None:
    ending = HostEnding(codes={0: -signal.SIGTERM, 1: -signal.SIGTERM}, order=[0, 1], stopped={0, 1}, requested=True)
    assert report(capsys, ending, host_setups(paths), paths) == (
        128 + signal.SIGTERM,
        f"\nrun stopped on request (checkpoint and stop): 2 process(es) in 12.3 s; outputs in {paths.root}/\n", "")
    assert report(capsys, ending, host_setups(paths), paths, announce=False) == (128 + signal.SIGTERM, "", "")
    assert not any(s.outcome.failed for s in host_setups(paths))  # no rank recorded as killed


def test_a_stop_on_request_whose_ranks_checkpointed_and_returned_exits_0(paths, capsys) -> None:
    ending = HostEnding(codes={0: 0, 1: 0}, order=[0, 1], requested=True)
    assert report(capsys, ending, host_setups(paths), paths) == (
        0, f"\nrun stopped on request (checkpoint and stop): 2 process(es) in 12.3 s; outputs in {paths.root}/\n", "")


def test_a_rank_that_failed_by_itself_during_a_stop_request_is_a_failure_not_a_stop(paths, capsys) -> None:
    setups = host_setups(paths)
    raised(setups[1], "RuntimeError: boom", 100.0)
    ending = HostEnding(codes={0: -signal.SIGTERM, 1: 1}, order=[1, 0], stopped={0}, requested=True)
    code, out, err = report(capsys, ending, setups, paths)
    assert (code, out) == (1, "")
    assert err.splitlines()[1:3] == ["== job failed ==", "rank 1 (host node0, local rank 1, pid 4001) failed first:"]


def test_the_stopped_status_is_128_plus_the_signal_or_the_status_a_script_chose() -> None:
    assert _stopped_status(HostEnding(codes={0: 0, 1: -signal.SIGINT}, order=[0, 1], stopped={1})) == 130
    assert _stopped_status(HostEnding(codes={0: 143, 1: -signal.SIGKILL}, order=[0, 1], stopped={0, 1})) == 143


def test_ranks_that_completed_their_recipe_but_crashed_while_exiting_are_not_a_failure(paths, capsys) -> None:
    setups = host_setups(paths, 3)
    for s in setups:
        s.outcome.mark_done(False)
    ending = HostEnding(codes={0: 0, 1: -signal.SIGSEGV, 2: 134}, order=[0, 1, 2])
    assert report(capsys, ending, setups, paths) == (
        0, "\nrun finished: every process completed its recipe, but rank 1 killed by SIGSEGV, rank 2 exit status 134 "
           f"while exiting (a teardown crash after training, not a training failure); outputs in {paths.root}/\n", "")
    assert not any(s.outcome.failed for s in setups)


# --------------------------------------------------------------------------- a host whose rank failed


def test_the_rank_that_raised_first_is_shown_with_its_traceback_and_the_others_after_it(paths, capsys) -> None:
    setups = host_setups(paths, 3)
    raised(setups[1], "RuntimeError: boom", 100.0)
    raised(setups[0], "RuntimeError: Connection closed by peer", 101.0, traceback="Traceback ...\n")
    ending = HostEnding(codes={0: 1, 1: 1, 2: -signal.SIGTERM}, order=[1, 0, 2], stopped={0, 2})
    code, out, err = report(capsys, ending, setups, paths)
    assert (code, out) == (1, "")
    assert err == ("\n== job failed ==\n"
                   "rank 1 (host node0, local rank 1, pid 4001) failed first:\n"
                   "\n"
                   f"{TRACEBACK}"
                   "\nthen:\n"
                   "  rank 0 (host node0): RuntimeError: Connection closed by peer\n"
                   "  1 other process(es) were stopped by the host agent\n"
                   f"\nper-rank logs: {paths.logs}/\n")
    assert [RankOutcome(paths, r).failed for r in range(3)] == [True, True, False]  # the agent recorded no kill


def test_a_traceback_already_on_the_terminal_is_pointed_to_not_printed_again(paths, capsys) -> None:
    setups = host_setups(paths, 2, shown=(0,))
    raised(setups[0], "ValueError: a message\nthat ends on its second line", 100.0)
    ending = HostEnding(codes={0: 1, 1: -signal.SIGTERM}, order=[0, 1], stopped={1})
    code, _, err = report(capsys, ending, setups, paths)
    assert code == 1
    assert err == ("\n== job failed ==\n"
                   "rank 0 (host node0, local rank 0, pid 4000) failed first:\n"
                   f"ValueError: a message (its traceback is above, and in {paths.logs}/rank00000.log)\n"
                   "  1 other process(es) were stopped by the host agent\n"
                   f"\nper-rank logs: {paths.logs}/\n")


def test_the_line_pointing_to_a_traceback_on_the_terminal_is_the_errors_whole_first_line(paths, capsys) -> None:
    setups = host_setups(paths, 1, shown=(0,))
    long = "StallError: stall: " + " ".join(f"rank {r} waits" for r in range(40))  # far past error_line's 160
    raised(setups[0], long, 100.0)
    _, _, err = report(capsys, HostEnding(codes={0: 1}, order=[0]), setups, paths)
    assert err.splitlines()[3] == f"{long} (its traceback is above, and in {paths.logs}/rank00000.log)"


def test_the_first_rank_to_fail_is_the_one_the_agent_saw_end_first_not_the_earliest_record(paths, capsys) -> None:
    setups = host_setups(paths, 2)
    raised(setups[0], "RuntimeError: Connection closed by peer", 100.0, traceback="Traceback (peer)\n")
    raised(setups[1], "RuntimeError: boom", 101.0)
    ending = HostEnding(codes={0: 1, 1: 1}, order=[1, 0])
    _, _, err = report(capsys, ending, setups, paths)
    assert err.splitlines()[2:9] == ["rank 1 (host node0, local rank 1, pid 4001) failed first:", "",
                                     *TRACEBACK.splitlines(), ""]
    assert err.splitlines()[9:11] == ["then:", "  rank 0 (host node0): RuntimeError: Connection closed by peer"]
    # the run's summary reads the same first failure from the run folder (not the earlier record's time)
    assert [e.rank for e in first_failures(paths, (0, 1))] == [1, 0]


def test_a_rank_that_lost_its_peer_is_never_named_before_the_rank_that_failed(paths, capsys) -> None:
    """Two ranks that ended in the same look of the agent are in no telling order: a lost connection is the symptom,
    the other error the cause, and the report and the run's summary name the cause first."""
    setups = host_setups(paths, 2)
    raised(setups[0], "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:1234", 101.0)
    raised(setups[1], "RuntimeError: injected failure on rank 1 at step 3", 100.5)
    _, _, err = report(capsys, HostEnding(codes={0: 1, 1: 1}, order=[0, 1]), setups, paths)
    assert err.splitlines()[2] == "rank 1 (host node0, local rank 1, pid 4001) failed first:"
    assert [e.rank for e in first_failures(paths, (0, 1))] == [1, 0]


def test_the_choice_of_the_rank_named_first_is_made_apart_from_its_words(paths) -> None:
    """choose_first, the pure choice the report renders: a cause before a lost peer; a rank that ended without a
    record when it was the first to fail; the first bad exit when no rank said anything."""
    setups = host_setups(paths, 3)
    raised(setups[0], "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:1234", 101.0)
    raised(setups[2], "RuntimeError: injected failure on rank 2", 100.5)
    errors = first_failures(paths, (0, 1, 2))
    chose = choose_first(HostEnding(codes={0: 1, 1: 0, 2: 1}, order=[0, 2, 1]), setups, errors)
    assert (chose.first, chose.named, chose.head.rank, [e.rank for e in chose.rest]) == (0, 2, 2, [0])
    assert not chose.exited_only and chose.silent == {}
    killed = choose_first(HostEnding(codes={0: 1, 1: -9, 2: 1}, order=[1, 0, 2]), setups, errors)
    assert (killed.named, killed.head, killed.silent) == (1, None, {1: -9}) and len(killed.rest) == 2
    # rank 1 killed (no record); ranks 0 and 2 lost it, and rank 0's end was seen first, in the same look
    raised(setups[2], "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:1235", 101.5)
    lost = first_failures(paths, (0, 1, 2))
    symptom_first = choose_first(HostEnding(codes={0: 1, 1: -9, 2: 1}, order=[0, 1, 2]), setups, lost)
    assert (symptom_first.first, symptom_first.named, symptom_first.head) == (0, 1, None)
    assert [e.rank for e in symptom_first.rest] == [0, 2]
    stopped = choose_first(HostEnding(codes={0: -15, 1: 0, 2: -15}, order=[2, 1, 0], stopped={0, 2}), setups, [])
    assert (stopped.first, stopped.named, stopped.exited_only) == (None, 2, True)


def test_a_script_that_exited_with_a_status_shows_what_it_said_last_and_how_to_pass_local_rank(paths, capsys) -> None:
    (setup,) = host_setups(paths, 1)
    setup.log_file.write_text("usage: train.py [-h] --local_rank LOCAL_RANK\n\n"
                              "train.py: error: the following arguments are required: --local_rank\n")
    raised(setup, "ScriptExit: train.py exited with status 2", 100.0, traceback="")
    code, out, err = report(capsys, HostEnding(codes={0: 2}, order=[0]), [setup], paths)
    assert (code, out) == (1, "")
    assert err == ("\n== job failed ==\n"
                   "rank 0 (host node0, local rank 0, pid 4000) failed first:\n"
                   "train.py exited with status 2:\n"
                   "    usage: train.py [-h] --local_rank LOCAL_RANK\n"
                   "    train.py: error: the following arguments are required: --local_rank\n"
                   "    hint: recipe.local_rank_arg=--local_rank passes it, as torch.distributed.launch did\n"
                   f"\nper-rank logs: {paths.logs}/\n")


def test_a_script_exit_shows_the_last_five_lines_the_script_said_and_no_hint_when_none_is_due(paths, capsys) -> None:
    (setup,) = host_setups(paths, 1)
    setup.log_file.write_text("".join(f"line {i}\n" for i in range(1, 8)))
    raised(setup, "ScriptExit: train.py exited with status 3", 100.0, traceback="")
    _, _, err = report(capsys, HostEnding(codes={0: 3}, order=[0]), [setup], paths)
    assert err.splitlines()[3:10] == ["train.py exited with status 3:", "    line 3", "    line 4", "    line 5",
                                      "    line 6", "    line 7", ""]


def test_a_script_exit_without_a_log_is_the_status_alone(paths, capsys) -> None:
    (setup,) = host_setups(paths, 1)
    raised(setup, "ScriptExit: -m trainer exited with status 1", 100.0, traceback="")
    _, _, err = report(capsys, HostEnding(codes={0: 1}, order=[0]), [setup], paths)
    assert err.splitlines()[3:5] == ["-m trainer exited with status 1", ""]


def test_a_rank_killed_first_is_named_with_its_signal_and_the_agent_writes_its_error_record(paths, capsys) -> None:
    setups = host_setups(paths, 2)
    raised(setups[0], "RuntimeError: Connection closed by peer", 100.0)
    ending = HostEnding(codes={0: 1, 1: -signal.SIGKILL}, order=[1, 0], stopped={0})
    before = time.time()
    code, out, err = report(capsys, ending, setups, paths)
    assert (code, out) == (1, "")
    assert err == ("\n== job failed ==\n"
                   f"rank 1 (host node0) failed first: killed by SIGKILL (no Python exception: {OOM_HINT})\n"
                   "\nthen:\n"
                   "  rank 0 (host node0): RuntimeError: Connection closed by peer\n"
                   f"\nper-rank logs: {paths.logs}/\n")
    record = setups[1].outcome.error()
    assert before <= record.timestamp <= time.time()
    assert dataclasses.replace(record, timestamp=0.0) == ErrorRecord(
        rank=1, local_rank=1, host="node0", machine=None, pid=None, timestamp=0.0,
        exception="killed by SIGKILL (no Python exception)", traceback="", killed=True, timeout=False,
        first=True)  # named first: the run's summary names it too
    assert setups[0].outcome.error().exception == "RuntimeError: Connection closed by peer"  # left as it wrote it


def test_ranks_that_died_silently_after_the_first_are_listed_then_and_recorded_too(paths, capsys) -> None:
    setups = host_setups(paths, 3)
    ending = HostEnding(codes={0: -signal.SIGKILL, 1: -signal.SIGSEGV, 2: -signal.SIGTERM}, order=[1, 0, 2],
                        stopped={2}, ended_at={1: 100.0, 0: 100.5, 2: 101.0})
    code, _, err = report(capsys, ending, setups, paths)
    assert code == 1
    assert err == ("\n== job failed ==\n"
                   f"rank 1 (host node0) failed first: killed by SIGSEGV (no Python exception: {NATIVE})\n"
                   "\nthen:\n"
                   "  rank 0 (host node0): killed by SIGKILL (no Python exception)\n"
                   "  1 other process(es) were stopped by the host agent\n"
                   f"\nper-rank logs: {paths.logs}/\n")
    assert [e.exception if (e := o.error()) else None for o in (s.outcome for s in setups)] == [
        "killed by SIGKILL (no Python exception)", "killed by SIGSEGV (no Python exception)", None]
    # stamped when the agent saw each end, so the run's summary finds the same first failure
    assert [setups[i].outcome.error().timestamp for i in (0, 1)] == [100.5, 100.0]


def test_a_rank_that_exited_with_a_status_without_an_error_is_named_by_it(paths, capsys) -> None:
    setups = host_setups(paths, 2)
    ending = HostEnding(codes={0: -signal.SIGTERM, 1: 7}, order=[1, 0], stopped={0})
    code, _, err = report(capsys, ending, setups, paths)
    assert code == 1
    assert err.splitlines()[2] == ("rank 1 (host node0) failed first: exit status 7 (no Python exception: it exited "
                                   "without one: os._exit, or a crash in native code)")
    assert setups[1].outcome.error().exception == "exit status 7 (no Python exception)"


def test_ranks_the_agent_stopped_on_ctrl_c_without_records_name_the_first_by_its_signal(paths, capsys) -> None:
    setups = host_setups(paths, 2)
    ending = HostEnding(codes={0: -signal.SIGINT, 1: -signal.SIGINT}, order=[1, 0], stopped={0, 1},
                        signum=signal.SIGINT)
    code, out, err = report(capsys, ending, setups, paths)
    assert (code, out) == (1, "")
    assert err == ("\n== job failed ==\n"
                   "rank 1 failed first: killed by SIGINT (no Python exception)\n"  # the first the agent saw end
                   "  1 other process(es) were stopped by the host agent\n"  # rank 0, not rank 1 again
                   f"\nper-rank logs: {paths.logs}/\n")
    assert not any(s.outcome.failed for s in setups)  # stopped by the agent: no killed record


# --------------------------------------------------------------------------- a hang


def test_a_rendezvous_timeout_names_the_ranks_that_waited_and_those_that_did_not_arrive(paths, capsys) -> None:
    setups = host_setups(paths, 2, world=4)
    raised(setups[0], "DistStoreError: Timed out after 31 seconds waiting for clients. 2/4 clients joined.", 100.0,
           timeout=True)
    raised(setups[1], "DistStoreError: Socket Timeout", 100.5, timeout=True)
    ending = HostEnding(codes={0: 1, 1: 1}, order=[0, 1])
    code, _, err = report(capsys, ending, setups, paths)
    assert code == 1
    assert err == (RANK_0_RAISED_FIRST +
                   "timeout: the process group did not form within init.timeout_s=30 s: rank(s) 0, 1 waited, "
                   "rank(s) 2, 3 did not arrive (as seen from this host)\n"
                   "    hint: were their hosts started, and can they reach the master? `run ... preflight=true` "
                   "checks every host's route, port and interface\n"
                   "\nthen:\n"
                   "  rank 1 (host node0): DistStoreError: Socket Timeout\n"
                   f"\nper-rank logs: {paths.logs}/\n")


def test_a_rendezvous_timeout_on_the_only_host_does_not_say_as_seen_from_this_host(paths) -> None:
    setups = host_setups(paths, 2, timeout_s=5)
    setups[0].outcome.mark_joined("gloo")
    raised(setups[1], "RuntimeError: Wait timeout", 100.0, timeout=True)
    errors = [setups[1].outcome.error()]
    assert _hang_summary(errors, setups, paths)[1] == (
        "timeout: the process group did not form within init.timeout_s=5 s: rank(s) 1 waited, rank(s) none did not "
        "arrive")


def test_a_collective_timeout_says_where_each_rank_is_from_their_dumps_and_records_the_verdict(paths, capsys) -> None:
    setups = host_setups(paths, 2)
    for s in setups:
        s.outcome.mark_joined("gloo")
    raised(setups[0], "RuntimeError: Timed out waiting 30000ms for recv operation to complete", 100.0, timeout=True)
    asked = request_dumps(paths, "timeout")
    entries = (Collective(2, "all_reduce", ((4,),), ("float32",), asked - 20.0),
               Collective(3, "all_reduce", ((4,),), ("float32",), asked - 9.0))
    RankWatchFiles(paths, 0).write_dump(RankDump(0, "node0", asked + 1.0, "request", "runner counter",
                                                 (GroupRecord("0", 3, 2, entries),)))
    RankWatchFiles(paths, 1).write_dump(RankDump(1, "node0", asked + 0.5, "request", "runner counter",
                                                 (GroupRecord("0", 2, 2, entries[:1]),), at="train.py:57 in main"))
    ending = HostEnding(codes={0: 1, 1: -signal.SIGTERM}, order=[0, 1], stopped={1})
    code, _, err = report(capsys, ending, setups, paths)
    said = ("timeout: a collective waited init.timeout_s=30 s: rank 0 waits in all_reduce #3 (process group 0) since "
            "10.0 s (float32[4]); rank 1 never entered it: its last collective was all_reduce #2, and it is at "
            "train.py:57 in main")
    assert code == 1
    assert err == (RANK_0_RAISED_FIRST +
                   f"{said}\n"
                   "    hint: a rank that skips, repeats or reorders a collective, or is slower than the timeout; "
                   "init.timeout_s sets the limit, launcher.stall_timeout_s ends a stall sooner\n"
                   "  1 other process(es) were stopped by the host agent\n"
                   f"\nper-rank logs: {paths.logs}/\n")
    verdict = read_diagnosis(paths)
    assert (verdict["kind"], verdict["text"], verdict["absent"], verdict["waiting"]) == ("timeout", said, [1], [0])


def _frame(path: str, line: int, name: str) -> str:
    return f'  File "{path}", line {line} in {name}'


def test_a_collective_timeout_without_dumps_shows_where_the_absent_rank_was_from_its_stack_dump(paths) -> None:
    setups = host_setups(paths, 2, timeout_s=60)
    for s in setups:
        s.outcome.mark_joined("gloo")
    raised(setups[0], "RuntimeError: Timed out waiting 60000ms for send operation to complete", 100.0, timeout=True)
    runner_frame = _frame(str(Path(failures.__file__).resolve().parent / "rank.py"), 300, "run_recipe")
    setups[1].log_file.write_text("\n".join([
        "step 10",
        "Current thread 0x00007f0000000001 (most recent call first):",  # an earlier dump: not this one
        _frame("/work/old.py", 1, "old"),
        "",
        "Thread 0x00007f0000000002 (most recent call first):",
        _frame("/usr/lib/python3.12/threading.py", 355, "wait"),
        "",
        "Current thread 0x00007f0000000001 (most recent call first):",
        _frame("/work/model.py", 88, "forward"),
        _frame("/work/train.py", 57, "main"),
        runner_frame,
        _frame("/work/below.py", 1, "never_shown"),
        ""]))
    errors = [setups[0].outcome.error()]
    assert _hang_summary(errors, setups, paths) == [
        "",
        "timeout: rank(s) 0 waited init.timeout_s=60 s in a collective; rank(s) 1 did not arrive",
        "  rank 1 was at (most recent call first):",
        '    File "/work/model.py", line 88 in forward',
        '    File "/work/train.py", line 57 in main',
        "    hint: a rank that skips or repeats a collective, or is slower than the timeout; init.timeout_s sets the "
        "limit"]


def test_a_stack_dump_stops_at_runpy_below_a_script(tmp_path) -> None:
    log = tmp_path / "rank.log"
    log.write_text("Current thread 0x1 (most recent call first):\n"
                   + "\n".join(_frame(f"/work/s{i}.py", i, f"f{i}") for i in range(10)) + "\n"
                   '  File "<frozen runpy>", line 88 in _run_code\n')
    assert _last_stack(str(log)) == [f'File "/work/s{i}.py", line {i} in f{i}' for i in range(8)]
    assert _last_stack(str(log), frames=20) == [f'File "/work/s{i}.py", line {i} in f{i}' for i in range(10)]
    assert _last_stack(str(tmp_path / "missing.log")) == []


def test_a_hang_already_diagnosed_is_said_from_the_verdict_and_a_stall_not_again(paths) -> None:
    setups = host_setups(paths, 2)
    raised(setups[0], "RuntimeError: boom", 100.0)  # not even a timeout: the verdict decides
    errors = [setups[0].outcome.error()]
    assert _hang_summary(errors, setups, paths) == []
    write_diagnosis(paths, "timeout", "ranks 0,1 wait in broadcast #4 (process group 0)", {"waiting": [0, 1]})
    assert _hang_summary(errors, setups, paths) == ["", "hang: ranks 0,1 wait in broadcast #4 (process group 0)"]
    write_diagnosis(paths, "stall", "no rank progressed for 60 s", None)  # rank 0's own error said it
    assert _hang_summary(errors, setups, paths) == []


def test_a_long_list_of_ranks_is_cut_after_twelve() -> None:
    assert rank_list(list(range(12)), 12) == "0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11"
    assert rank_list(list(range(20)), 12) == "0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, ... (20)"
    assert rank_list([], 12) == ""
