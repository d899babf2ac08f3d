"""runner.worker.attempt_report: the exit status and the lines of an attempt at its end, where the cause is
another host's failure, a signal, or another host's earlier failure (the report of this host's own ranks:
tests/worker/test_failures.py); and ending together, which only tasks that end together (mpirun) wait for."""

from __future__ import annotations

import signal

import pytest

from runner.common import exits
from runner.worker.attempt_report import Ended, end_together, report
from runner.worker.channel_records import JobFailure
from runner.worker.host_ending import HostEnding
from runner.worker.share import AgentRole
from test_preparation import plan_of, setups_of, two_hosts

pytestmark = pytest.mark.unit

PEER = JobFailure(rank=0, host="a", text="RuntimeError: boom", time=1.0)


def ended_of(paths, ending: HostEnding) -> Ended:
    spec = two_hosts()
    return Ended(ending=ending, plan=plan_of(spec, paths), paths=paths, setups=setups_of(spec, paths, 1), report=None,
                 channel=None, elapsed_s=3.0)


def test_another_hosts_failure_fails_this_hosts_share_and_says_whose_it_was(paths, capsys) -> None:
    ending = HostEnding(codes={2: -signal.SIGTERM, 3: -signal.SIGTERM}, order=[2, 3], stopped={2, 3}, peer_failed=PEER)
    assert report(ended_of(paths, ending), AgentRole(node_rank=1)) == exits.FAILED
    assert capsys.readouterr().err == ("\nrank 0 on a failed: RuntimeError: boom\n    stopped this host's 2 process(es) "
                                       "(attempt 1); that host's report says more\n")


def test_a_lost_host_is_named_as_the_host(paths, capsys) -> None:
    lost = JobFailure(rank=None, host="c", text="ssh: connection to c lost", time=1.0)
    ending = HostEnding(codes={2: 0, 3: 0}, order=[2, 3], peer_failed=lost)
    assert report(ended_of(paths, ending), AgentRole(node_rank=1)) == exits.FAILED
    assert capsys.readouterr().err.startswith("\nhost c: ssh: connection to c lost\n")


def test_a_signal_ends_the_share_with_its_status(paths) -> None:
    ending = HostEnding(codes={2: -signal.SIGINT, 3: -signal.SIGINT}, order=[2, 3], stopped={2, 3},
                        signum=signal.SIGINT)
    assert report(ended_of(paths, ending), AgentRole(node_rank=1)) == exits.from_signal(signal.SIGINT)


def test_without_a_channel_nobody_waits_to_end_together(paths) -> None:
    end_together(ended_of(paths, HostEnding(codes={}, order=[])), AgentRole(node_rank=0))  # returns at once
