"""runner.launchers.ssh.rejoin: the lost hosts tried again while a round runs, with check commands that are shell
lines standing in for ssh (the real check over ssh, on namespace hosts: tests/e2e/test_lost_hosts.py)."""

from __future__ import annotations

import shlex
import signal
import time

import pytest

from runner.environments.versions import Versions
from runner.launchers.ssh.host import SshHost
from runner.launchers.ssh.rejoin import Returning, ReturnWatch
from runs import wait_until

pytestmark = pytest.mark.unit

HERE = Versions("0.1.0", "2.13.0+cpu", "3.11.7")
ANSWERS = f"echo {shlex.quote(HERE.line())}"  # what `run --version` says on a host that is ready


def host(name: str, check: str) -> SshHost:
    return SshHost(index=3, name=name, label=f"lost host {name}", destination=name, ranks=(), run="run",
                   check=("sh", "-c", check), dials=False, start=(), collect=())


def watch(*tried: Returning, every_s: float = 0.01, clock=time.time) -> ReturnWatch:
    return ReturnWatch(tried, every_s, connect_timeout_s=1, here=HERE, clock=clock).start()


def test_a_host_that_passes_the_check_is_ready_and_one_that_fails_it_is_not() -> None:
    found = watch(Returning("c", host("c", ANSWERS), due=0.0), Returning("d", host("d", "exit 255"), due=0.0))
    try:
        wait_until(found.ready, 10, "host c ready")
        assert found.ready() == ("c",)
    finally:
        found.close()


def test_a_host_with_another_runner_is_not_taken_back() -> None:
    other = Versions("0.0.9", HERE.torch, HERE.python)
    tries = []
    found = watch(Returning("c", host("c", f"echo {shlex.quote(other.line())}"), due=0.0),
                  clock=lambda: tries.append(1) or 0.0)
    try:
        wait_until(lambda: len(tries) >= 3, 10, "three tries")  # tried, and tried again: never ready
        assert found.ready() == ()
    finally:
        found.close()


def test_a_host_is_not_tried_before_it_is_due() -> None:
    """launcher.rejoin_after_s: a host taken back a moment ago is due later; the watch's clock says when."""
    now = [100.0]
    found = watch(Returning("c", host("c", ANSWERS), due=160.0), clock=lambda: now[0])
    try:
        wait_until(lambda: found._thread.is_alive(), 10, "the watch running")
        assert found.ready() == ()
        now[0] = 160.0
        wait_until(found.ready, 10, "host c ready once due")
    finally:
        found.close()


def test_close_ends_a_check_under_way_and_the_thread() -> None:
    found = watch(Returning("c", host("c", "exec sleep 60"), due=0.0))
    wait_until(lambda: found._trying is not None, 10, "a check under way")
    trying = found._trying
    found.close()
    assert not found._thread.is_alive() and found.ready() == ()
    assert trying.returncode == -signal.SIGKILL  # killed, and waited for: nothing left


def test_no_host_or_no_interval_starts_no_thread() -> None:
    assert not ReturnWatch((), 1.0, 1, HERE).start()._thread.is_alive()
    assert not ReturnWatch((Returning("c", host("c", ANSWERS), 0.0),), 0, 1, HERE).start()._thread.is_alive()


def test_a_spare_that_passes_is_kept_ready_and_the_watch_goes_on_for_the_others() -> None:
    found = watch(Returning("s", host("s", ANSWERS), due=0.0, joins=False), Returning("c", host("c", "exit 255"), 0.0))
    try:
        wait_until(found.spares, 10, "spare s ready")
        assert found.spares() == ("s",) and found.ready() == ()
        assert found._thread.is_alive()  # c is still tried
    finally:
        found.close()
