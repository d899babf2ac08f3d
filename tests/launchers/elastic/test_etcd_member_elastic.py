"""runner.launchers.elastic.etcd_member: the job's own etcd, its members named and addressed from the spec, on ports
derived from the run id; three real members on addresses of this machine (127.0.0.x) decide while two of them are up,
and each stops with nothing left."""

from __future__ import annotations

import dataclasses

import psutil
import pytest

from conftest import hosts_override, validate
from runner.launchers.elastic.etcd import Etcd, EtcdError
from runner.launchers.elastic.etcd_member import OwnCluster, OwnMember
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
