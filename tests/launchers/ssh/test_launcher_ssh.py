"""launcher=ssh without any host (runner.launchers.ssh.launcher): the commands it runs (the golden files, parsed back: what
reaches each host's shell is exactly the words meant, whatever a value holds), the ssh options, where each host
keeps the run, and how the hosts and their ranks are placed. The launch itself, on hosts with a real sshd:
tests/e2e/test_ssh.py."""

from __future__ import annotations

import shlex

import pytest

from conftest import GOLDEN
from runner.launchers.ssh.launcher import ssh_base
from runner.spec.schema import SshOptions
from ssh_fixtures import ssh_launcher

pytestmark = pytest.mark.unit


def _lines(name: str, note: str) -> list[list[str]]:
    """The commands of a golden file that follow a comment containing ``note``, as argv lists."""
    lines = (GOLDEN / f"{name}.txt").read_text().splitlines()
    return [shlex.split(lines[i + 1]) for i, line in enumerate(lines) if line.startswith("#") and note in line]


def test_each_host_gets_exactly_the_words_meant_whatever_a_value_holds() -> None:
    """ssh joins its arguments into one line for the host's shell: the remote command is quoted once for it, so a
    workdir with a space and exported values with $( ), ; and quotes arrive as the words they were."""
    starts = _lines("ssh_options", "process(es)")
    assert len(starts) == 2
    for i, argv in enumerate(starts):
        cut = argv.index("--")
        assert argv[:2] == ["/usr/bin/ssh", "-T"] and argv[cut + 1] == ("gpu-a", "gpu-b")[i]
        assert len(argv) == cut + 3  # one remote command, one word
        remote = shlex.split(argv[-1])
        assert remote == ["cd", "/work/my proj", "&&", "exec", "env", "HF_HOME=/data/hf cache",
                          "WANDB_MODE=$(rm -rf ~); 'offline'", "/opt/venv/bin/run", "--ssh-host", str(i), "/runs/R1"]
    checks = _lines("ssh_options", "the check")
    port = shlex.split(checks[0][-1])[-2]  # (the port derived from the run id)
    assert [shlex.split(c[-1]) for c in checks] == [["cd", "/work/my proj", "&&", "exec", "/opt/venv/bin/run", "--reach",
                                                     "10.0.0.1", port, str(i)] for i in (0, 1)]
    collects = _lines("ssh_options", "after the run")
    assert shlex.split(collects[0][-1]) == ["cd", "/runs/R1", "&&", "exec", "tar", "-cf", "-", "--ignore-failed-read",
                                            "logs", "metrics.jsonl"]


def test_ssh_options_default_to_batch_mode_a_timeout_and_keepalives_and_your_own_config() -> None:
    assert ssh_base(SshOptions()) == ["ssh", "-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
                                      "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"]  # no -F: ~/.ssh/config
    options = _lines("ssh_options", "process(es)")[0]
    assert options[:options.index("--")] == [
        "/usr/bin/ssh", "-T", "-F", "/home/alice/.ssh/cluster_config", "-l", "alice", "-p", "2222", "-i",
        "/home/alice/.ssh/id_ed25519", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "ProxyJump=bastion",
        "-o", "StrictHostKeyChecking=accept-new"]  # keepalive_s=0: none


def test_each_host_keeps_the_run_at_its_path_under_the_jobs_folder(tmp_path) -> None:
    """The hosts start in the job's folder: a run folder under the folder `run` started in is at the same place
    under the job's folder there; another (hydra.run.dir elsewhere) at the same path."""
    here = ssh_launcher(tmp_path, cwd=str(tmp_path), root=tmp_path / "outputs" / "runs" / "R1")
    assert here.remote_folder() == str(tmp_path / "outputs" / "runs" / "R1")  # workdir unset: this folder
    named = ssh_launcher(tmp_path, "workdir=/tmp", cwd=str(tmp_path), root=tmp_path / "outputs" / "runs" / "R1")
    assert named.remote_folder() == "/tmp/outputs/runs/R1"
    apart = ssh_launcher(tmp_path, cwd="/elsewhere", root=tmp_path / "runs" / "R1")
    assert apart.remote_folder() == str(tmp_path / "runs" / "R1")


def test_the_hosts_share_one_run_id_and_port_and_every_rank_is_placed(tmp_path) -> None:
    launcher = ssh_launcher(tmp_path)
    hosts = launcher.hosts()
    assert [(h.index, h.name, h.destination, h.ranks) for h in hosts] == [(0, "a", "a", (0, 1)), (1, "b", "b", (2,))]
    assert launcher.plan.job.spec.run_id == "R1" and launcher.plan.job.spec.init.master_port  # pinned for every host
    assert "exec /venv/bin/run --ssh-host 1 " in hosts[1].start[-1]


def test_unset_exported_variables_are_left_out(tmp_path) -> None:
    launcher = ssh_launcher(tmp_path, "launcher.ssh.export=[HF_HOME,UNSET_HERE]", HF_HOME="/data/hf")
    assert shlex.split(launcher.hosts()[0].start[-1])[4:6] == ["env", "HF_HOME=/data/hf"]


def test_the_dry_run_says_how_a_lost_host_is_taken_back(tmp_path) -> None:
    elastic = ("topology.min_nodes=1", "launcher.max_restarts=2")
    lines = [c.host for c in ssh_launcher(tmp_path, *elastic).request().commands if c.argv is None]
    assert ("a lost host is tried again every 10 s (launcher.ssh.rejoin_s) and joins at the next checkpoint, up to 2 "
            "host(s) (topology.max_nodes), each at most once per 60 s (launcher.rejoin_after_s)") in lines
    never = ssh_launcher(tmp_path, *elastic, "launcher.ssh.rejoin_s=0").request().commands
    assert "a lost host is not taken back (launcher.ssh.rejoin_s=0)" in [c.host for c in never if c.argv is None]
    assert ssh_launcher(tmp_path).rejoin_line() not in [c.host for c in ssh_launcher(tmp_path).request().commands]


ABC = ("topology.hosts=[{name: a, devices: 1}, {name: b, devices: 1}, {name: c, devices: 1}]",
       "topology.min_nodes=1", "launcher.max_restarts=2", "recipe.global_batch_size=3")


def test_before_a_round_the_hosts_that_fail_the_check_are_left_out_and_said(tmp_path, monkeypatch, capsys) -> None:
    from runner.launchers.ssh import launcher as module

    launcher = ssh_launcher(tmp_path, *ABC)
    a, b, c = launcher.hosts()
    monkeypatch.setattr(module, "failures", lambda *_: {c: ("ssh could not log in (exit 255): timed out", "up?")})
    assert launcher.left_out() == {2: "it failed the check: ssh could not log in (exit 255): timed out"}
    assert "left out: launcher=ssh: host 2 (c): ssh could not log in" in capsys.readouterr().err
    monkeypatch.setattr(module, "failures", lambda *_: {})
    assert launcher.left_out() == {} and "ssh: 3 host(s) ready" in capsys.readouterr().err


def test_where_no_other_host_reaches_host_0_host_0_is_the_one_left_out(tmp_path, monkeypatch, capsys) -> None:
    """Its network, not theirs: the next host 0 serves the next attempt's rendezvous."""
    from runner.launchers.ssh import launcher as module

    launcher = ssh_launcher(tmp_path, *ABC)
    _, b, c = launcher.hosts()
    unreached = ("host 0's rendezvous: a:29500 did not answer within 10 s", "its firewall?")
    monkeypatch.setattr(module, "failures", lambda *_: {b: unreached, c: unreached})
    assert launcher.left_out() == {0: "none of the 2 other hosts reaches its rendezvous (host 0's rendezvous: a:29500 "
                                      "did not answer within 10 s)"}
    assert "ssh: host 0 (a) left out: none of the 2 other hosts" in capsys.readouterr().err
    monkeypatch.setattr(module, "failures", lambda *_: {c: unreached})  # one of two: c's own network
    assert list(launcher.left_out()) == [2]


def test_a_spare_that_fails_the_check_of_the_start_is_tried_later_and_a_host_that_fails_refuses(
        tmp_path, monkeypatch, capsys) -> None:
    from runner.launchers.ssh import launcher as module

    launcher = ssh_launcher(tmp_path, *ABC, "topology.spares=[{name: s, devices: 1}]")
    (spare,) = launcher.spare_hosts()
    monkeypatch.setattr(module, "failures", lambda *_: {spare: ("ssh could not log in (exit 255): timed out", "up?")})
    unready: list[str] = []
    assert launcher.check(with_spares=True, unready=unready) is None and unready == ["s"]
    said = capsys.readouterr().err
    assert "ssh: spare 0 (s) not ready: ssh could not log in (exit 255): timed out; tried again every 10 s" in said
    assert "ssh: 3 host(s) ready" in said and "spare(s) ready" not in said
    refused = launcher.check(with_spares=True)  # without the list (or with launcher.ssh.rejoin_s=0): a refusal
    assert refused is not None and refused.code == 2 and "nothing was started" in capsys.readouterr().err
    a, _, _ = launcher.hosts()
    monkeypatch.setattr(module, "failures", lambda *_: {a: ("ssh could not log in (exit 255): refused", "sshd?")})
    assert launcher.check(with_spares=True, unready=[]).code == 2  # a host is no spare: nothing starts
