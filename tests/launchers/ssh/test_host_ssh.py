"""runner.launchers.ssh.host, the ssh launch's data model: the ssh client's options before ``-- HOST COMMAND``, and
what a host's run folder gives back, relative to it."""

from __future__ import annotations

import pytest

from runner.launchers.ssh.host import KEEPALIVE_COUNT, collected, ssh_base
from runner.records.paths import RunPaths
from runner.spec.schema import SshOptions

pytestmark = pytest.mark.unit


def test_the_ssh_client_never_asks_and_says_each_option_once() -> None:
    assert ssh_base(SshOptions()) == ["ssh", "-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o",
                                      "ServerAliveInterval=5", "-o", f"ServerAliveCountMax={KEEPALIVE_COUNT}"]
    given = SshOptions(command="/usr/bin/ssh", config_file="/c", user="alice", port=2222, identity_file="/k",
                       keepalive_s=0, options=["ProxyJump=bastion"])
    assert ssh_base(given) == ["/usr/bin/ssh", "-T", "-F", "/c", "-l", "alice", "-p", "2222", "-i", "/k", "-o",
                               "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "ProxyJump=bastion"]


def test_a_host_gives_back_its_logs_and_the_metrics(tmp_path) -> None:
    assert collected(RunPaths(tmp_path / "R1", "R1")) == ("logs", "metrics.jsonl")
