"""Where the other hosts of a launcher=ssh job dial a host (runner.launchers.ssh.address): the HostName that the real
``ssh -G`` finds for an alias of an ssh_config, the name itself where ssh knows no other, the spec's addr where it
gives one; pinned into the run's spec (every host plans with it) and said in the dry run. On the test bed, with an
ssh_config of aliases only: tests/e2e/test_ssh.py."""

from __future__ import annotations

import pytest

from runner.launchers.ssh.launcher import ssh_base
from runner.launchers.ssh.address import host_address, ssh_hostname
from runner.spec.schema import SshOptions
from runner.spec.topology import Host
from ssh_fixtures import ssh_launcher

pytestmark = pytest.mark.unit  # (ssh is the test machine's: scripts/system_packages.sh installs the client)


def aliases(tmp_path) -> str:
    config = tmp_path / "ssh_config"
    config.write_text("Host a\n  HostName 10.20.0.1\nHost b\n  HostName 10.20.0.2\n  Port 2222\n")
    return str(config)


def base(config: str | None = None, command: str = "ssh") -> list[str]:
    return ssh_base(SshOptions(config_file=config, command=command))


def test_ssh_g_gives_an_aliass_hostname_and_a_plain_name_back_unchanged(tmp_path) -> None:
    config = aliases(tmp_path)
    assert ssh_hostname(base(config), "a") == ("10.20.0.1", "")
    assert ssh_hostname(base(config), "gpu-7") == ("gpu-7", "")
    found, why = ssh_hostname(base(str(tmp_path / "missing")), "a")
    assert found is None and why.startswith("ssh -G exited 255: ") and "missing" in why
    found, why = ssh_hostname(base(config, command=str(tmp_path / "no-ssh")), "a")
    assert found is None and "No such file" in why


def test_a_hosts_address_and_why(tmp_path) -> None:
    b = base(aliases(tmp_path))
    found = host_address(Host(index=0, name="a", addr=None, devices=1, gpus=(0,)), b)
    assert (found.addr, found.found) == ("10.20.0.1", True)
    assert found.line() == "host 0 (a) is dialled at 10.20.0.1: ssh -G a: HostName 10.20.0.1 (the name is ssh's alias)"
    given = host_address(Host(index=1, name="a", addr="192.168.1.5", devices=1, gpus=(0,)), b)
    assert (given.addr, given.found, given.how) == ("192.168.1.5", False, "topology.hosts[1].addr")
    plain = host_address(Host(index=1, name="gpu-7", addr=None, devices=1, gpus=(0,)), b)
    assert (plain.addr, plain.found) == ("gpu-7", False) and plain.how.startswith("its name (ssh -G gpu-7 names no")


def test_the_launch_pins_the_found_addresses_so_every_host_and_rank_dials_them(tmp_path) -> None:
    launcher = ssh_launcher(tmp_path, f"launcher.ssh.config_file={aliases(tmp_path)}")
    job = launcher.plan.job
    assert [h.addr for h in job.hosts] == ["10.20.0.1", "10.20.0.2"]
    assert [h.addr for h in job.spec.topology.hosts] == ["10.20.0.1", "10.20.0.2"]  # spec.yaml: what every host reads
    assert job.master_addr == launcher.plan.master_addr == "10.20.0.1"
    assert {launcher.plan.host_env(h)["MASTER_ADDR"] for h in job.hosts} == {"10.20.0.1"}
    assert [h.destination for h in launcher.hosts()] == ["a", "b"]  # ssh still logs in by the alias
    said = launcher.request().materialize()
    assert "# host 1 (b) is dialled at 10.20.0.2: ssh -G b: HostName 10.20.0.2 (the name is ssh's alias)" in said
    # without the aliases: the names, as before
    plain = ssh_launcher(tmp_path)
    assert [h.addr for h in plain.plan.job.hosts] == [None, None] and plain.plan.job.master_addr == "a"
