"""The ssh launch's check before anything starts (runner.launchers.ssh.check): how each failed check reads, with its
hint. The check run on hosts with a real sshd (a refused login, no `run`, another torch):
tests/e2e/test_ssh.py, test_a_host_that_refuses_the_login_is_named_and_nothing_starts and the two after it."""

from __future__ import annotations

import pytest

from runner.environments.versions import Versions, installed
from runner.launchers.ssh.check import verdict
from runner.worker.reach import Reached
from ssh_fixtures import ssh_launcher

pytestmark = pytest.mark.unit


def test_a_failed_check_says_why_with_a_hint(tmp_path) -> None:
    here = installed()
    host = ssh_launcher(tmp_path).hosts()[1]
    assert host.dials  # two hosts, init=env: every host's check dials host 0's rendezvous
    reached = Reached(ok=True, said="a answered on port 29500 (nothing listens there yet)")
    ok = f"{here.line()}\n{reached.line()}\n"
    assert verdict(host, 0, ok, "", here) is None
    why, hint = verdict(host, 255, "", "root@b: Permission denied (publickey).\n", here)
    assert why == "ssh could not log in (exit 255): root@b: Permission denied (publickey)." and "authorized_keys" in hint
    why, hint = verdict(host, 255, "", "ssh: connect to host b port 22: Connection timed out\n", here)
    assert "does not answer" in hint
    why, hint = verdict(host, 127, "", "bash: line 1: /venv/bin/run: No such file or directory\n", here)
    assert why.startswith("/venv/bin/run is not there or cannot run (exit 127") and "launcher.ssh.run=" in hint
    why, hint = verdict(host, 1, "", "bash: line 1: cd: /work/proj: No such file or directory\n", here)
    assert why.startswith("the job's folder is not there") and "workdir=" in hint
    older = Versions(here.runner, "2.12.0", here.python)
    why, hint = verdict(host, 0, older.line(), "", here)
    assert why == (f"runner {here.runner} and torch 2.12.0 there, runner {here.runner} and torch {here.torch} here")
    assert verdict(host, 0, "Hydra 1.3.2\n", "", here)[0].startswith("/venv/bin/run --version said no versions")


def test_a_host_that_cannot_reach_host_0s_rendezvous_fails_its_check_with_what_it_found(tmp_path) -> None:
    here = installed()
    host = ssh_launcher(tmp_path).hosts()[1]
    unresolved = Reached(ok=False, said="'a' does not resolve on this host (Name or service not known)",
                         hint="give host 0 an address every host can reach and resolve")
    why, hint = verdict(host, 0, f"{here.line()}\n{unresolved.line()}\n", "", here)
    assert why == "host 0's rendezvous: 'a' does not resolve on this host (Name or service not known)"
    assert hint == unresolved.hint
    # a `run` that printed its versions but no answer (an older runner's --reach is no option of its)
    why, hint = verdict(host, 0, f"{here.line()}\n", "", here)
    assert why.startswith("/venv/bin/run --reach said no answer") and "this runner's" in hint


def test_the_check_command_asks_versions_then_the_reach_of_host_0s_address_and_port(tmp_path) -> None:
    launcher = ssh_launcher(tmp_path)
    addr, port = launcher.rendezvous()
    assert addr == "a" and port == int(launcher.plan.master_port)
    host = launcher.hosts()[1]
    assert host.check[-1] == f"cd /work/proj && exec /venv/bin/run --reach a {port} 1"

