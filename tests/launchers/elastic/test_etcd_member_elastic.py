"""runner.launchers.elastic.etcd_member: the job's own etcd, its members named and addressed from the spec, on ports
derived from the run id; three real members on addresses of this machine (127.0.0.x) decide while two of them are up,
and each stops with nothing left; a member whose machine's `run` is gone (its data with it) joins again, removed and
added as etcd's procedure says, never while it still runs."""

from __future__ import annotations

import dataclasses

import psutil
import pytest

from conftest import hosts_override, validate
from runner.launchers.elastic.etcd import Etcd, EtcdError
from runner.launchers.elastic.etcd_member import MemberRefused, OwnCluster, OwnMember, member_start
from runner.plan.processes import RunPort, port_for


def cluster_of(*overrides: str) -> OwnCluster:
    got = validate(("launcher=manual", "device=cpu", "init=tcp", "run_id=R9", "launcher.max_restarts=2",
                    *hosts_override(*({"name": n, "devices": 1} for n in "abc")), *overrides))
    assert got.valid, got.rendered()
    return OwnCluster.of(got.job)


@pytest.mark.unit
def test_the_members_are_the_hosts_then_the_spares_on_ports_of_the_run_id() -> None:
    own = cluster_of("topology.spares=[{name: s, devices: 1}]")
    assert (own.names, own.addrs, own.size, own.floor) == (("a", "b", "c", "s"), ("a", "b", "c", "s"), 4, 3)
    assert (own.client_port, own.peer_port, own.token) == (port_for("R9", RunPort.ETCD_CLIENTS),
                                                           port_for("R9", RunPort.ETCD_PEERS), "R9")
    assert own.endpoints == [f"{n}:{own.client_port}" for n in "abcs"]
    assert own.endpoints_from(2) == [f"{n}:{own.client_port}" for n in "cabs"]  # a machine asks its own member first
    assert cluster_of().floor == 2  # 3 members: 2 decide


def test_three_members_decide_while_two_are_up_and_leave_nothing(tmp_path) -> None:
    own = dataclasses.replace(cluster_of("topology.min_nodes=2"), addrs=("127.0.0.51", "127.0.0.52", "127.0.0.53"))
    members = [OwnMember(own, i, tmp_path / f"etcd{i}.log") for i in range(3)]
    try:
        assert [m.serving(30) for m in members] == [None, None, None]
        etcd = Etcd(own.endpoints)
        etcd.put("/k", "v")
        members[0].stop()
        assert etcd.get("/k") == "v"  # two of three: still a majority
        members[1].stop()
        with pytest.raises(EtcdError):  # one of three decides nothing
            Etcd(own.endpoints, ask_s=1.0).put("/k", "w")
    finally:
        for m in members:
            m.stop()
    assert not any(m.data_dir.exists() for m in members)
    assert not [p for p in psutil.process_iter(["cmdline"]) if "R9" in " ".join(p.info["cmdline"] or ())]


def test_a_member_whose_run_is_gone_joins_the_cluster_again_with_what_it_decided(tmp_path) -> None:
    own = dataclasses.replace(cluster_of("topology.min_nodes=2", "run_id=R8"),
                              addrs=("127.0.0.61", "127.0.0.62", "127.0.0.63"))
    assert member_start(own, 0, 10) == "new"  # nobody up: the bootstrap
    members = [OwnMember(own, i, tmp_path / f"etcd{i}.log") for i in range(2)]
    try:
        assert [m.serving(30) for m in members] == [None, None]  # two of three decide already
        assert member_start(own, 2, 10) == "new"  # a member of the bootstrap that never started: as the others
        members.append(OwnMember(own, 2, tmp_path / "etcd2.log"))
        assert members[2].serving(30) is None
        Etcd(own.endpoints).put("/k", "v")
        with pytest.raises(MemberRefused, match="still runs here"):  # a second `run` of host 2 removes nothing
            member_start(own, 2, 10)
        members[2].process.kill()  # the machine's `run` gone, its member's data with it
        members[2].process.wait()
        members[2].stop()
        assert member_start(own, 2, 60) == "existing"
        members[2] = OwnMember(own, 2, tmp_path / "etcd2-again.log", "existing")
        assert members[2].serving(30) is None
        assert Etcd([own.endpoints[2]]).get("/k") == "v"  # what the cluster decided before, from its own member
        listed = Etcd(own.endpoints).members()
        assert sorted(m.get("name") for m in listed) == ["a", "b", "c"], listed
    finally:
        for m in members:
            m.stop()
    assert not [p for p in psutil.process_iter(["cmdline"]) if "R8" in " ".join(p.info["cmdline"] or ())]
