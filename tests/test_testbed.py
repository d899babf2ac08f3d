"""The namespace test bed itself (scripts/testbed.py, fixture ``testbed``): Slurm runs tasks on every host with
its own address, hosts reach each other over the bridge and never over their decoys, mpirun reaches both
namespaces through the rsh agent, the data network (``--data-network``) is cut between two hosts or at one while
the lan answers, and `down` leaves nothing behind."""

from __future__ import annotations

import argparse
import importlib
import ipaddress
import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from types import ModuleType

import pytest

from lost_hosts import data_cut_between, data_link
from runs import SHARED_CORES, wait_until
from testbed_fixtures import (TESTBED, Bed, bed_cmd, bed_down, bed_of_its_own, bed_up, leftovers,
                              missing_requirements, namespace_inodes, unavailable)

pytestmark = pytest.mark.timeout(120)

# one line per task/rank: "<node or rank fields> <lan0 address>"
LAN_ADDR = 'ip -4 -o addr show dev lan0 | sed -E "s|.* inet ([0-9.]+)/.*|\\1|"'

# Every rank listens on its lan address, then connects to the next rank's: a TCP ring across the hosts.
LISTENER = """
import socket, sys
s = socket.create_server((sys.argv[1], 0))
print(s.getsockname()[1], flush=True)
conn, peer = s.accept()
conn.sendall(b"hello from " + sys.argv[1].encode())
print(peer[0], flush=True)
"""
CONNECT = """
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])) as c:
    print(c.recv(100).decode(), c.getsockname()[0])
"""

RING_C = r"""
#include <mpi.h>
#include <stdio.h>
int main(int argc, char **argv) {
    int rank, size, one = 1, sum = 0, got = -1;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Sendrecv(&rank, 1, MPI_INT, (rank + 1) % size, 0, &got, 1, MPI_INT, (rank + size - 1) % size, 0,
                 MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    printf("%d %d %d %d\n", rank, size, sum, got);
    MPI_Finalize();
    return 0;
}
"""


def run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, f"{done.args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def listen_in(bed: Bed, host: str) -> tuple[subprocess.Popen[str], int]:
    """A one-connection TCP server on ``host``'s lan address (inside its namespace) and its port."""
    server = subprocess.Popen(bed.exec_argv(host, [sys.executable, "-c", LISTENER, bed.addrs[host]]),
                              stdout=subprocess.PIPE, text=True)
    return server, int(server.stdout.readline())


def connect_from(bed: Bed, host: str | None, target: str, port: int, timeout: float = 5):
    """Connect from ``host``'s namespace (None: the root namespace) to target:port; the finished process."""
    argv = [sys.executable, "-c", CONNECT, target, str(port), str(timeout)]
    return run(bed.exec_argv(host, argv) if host else argv, timeout=timeout + 10)


def links(bed: Bed, host: str) -> list[dict]:
    return json.loads(ok(run(bed.exec_argv(host, ["ip", "-j", "addr", "show"]))))


def route_dev(bed: Bed, host: str, addr: str) -> str | None:
    done = run(bed.exec_argv(host, ["ip", "-j", "route", "get", addr]))
    return json.loads(done.stdout)[0].get("dev") if done.returncode == 0 else None


# --------------------------------------------------------------------------- slurm


def test_srun_runs_tasks_on_every_host_with_its_own_address(testbed: Bed):
    out = ok(run(["srun", f"--nodes={len(testbed.hosts)}", "--ntasks-per-node=2", f"--partition={testbed.partition}",
                  "sh", "-c", f'echo "$SLURMD_NODENAME $SLURM_PROCID $({LAN_ADDR})"'], env=testbed.env()))
    tasks = [line.split() for line in out.splitlines()]
    assert sorted(int(rank) for _, rank, _ in tasks) == list(range(2 * len(testbed.hosts))), out
    assert {node for node, _, _ in tasks} == set(testbed.names), out
    for node, _, addr in tasks:
        assert addr == testbed.addrs[node], out


def test_sbatch_wait_runs_a_batch_job_across_the_nodes(testbed: Bed, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text('#!/bin/sh\necho "batch $SLURMD_NODENAME"\nsrun sh -c \'echo "step $SLURMD_NODENAME"\'\n')
    out = tmp_path / "job.out"
    ok(run(["sbatch", "--wait", f"-N{len(testbed.hosts)}", "--ntasks-per-node=1", f"--output={out}", str(script)],
           env=testbed.env(), timeout=60))
    lines = out.read_text().split("\n")
    assert f"batch {testbed.names[0]}" in lines
    assert {line.split()[1] for line in lines if line.startswith("step ")} == set(testbed.names)


def test_env_prints_the_slurm_conf_to_export(testbed: Bed):
    out = ok(run(bed_cmd("env", "--state", str(testbed.state))))
    assert f"export SLURM_CONF={testbed.slurm_env['SLURM_CONF']}" in out.splitlines()


# --------------------------------------------------------------------------- network


def test_hosts_reach_each_other_and_the_root_namespace_by_name(testbed: Bed):
    h1, h2 = testbed.names[:2]
    ok(run(testbed.exec_argv(h1, ["ping", "-c1", "-W2", testbed.addrs[h2]])))
    ok(run(testbed.exec_argv(h2, ["ping", "-c1", "-W2", testbed.bridge_addr])))
    assert ok(run(testbed.exec_argv(h1, ["getent", "hosts", h2]))).split()[0] == testbed.addrs[h2]
    for source in (h1, None):  # from the other host, and from the root namespace over the bridge
        server, port = listen_in(testbed, h2)
        greeting = ok(connect_from(testbed, source, h2, port))
        assert greeting.split() == ["hello", "from", testbed.addrs[h2],
                                    testbed.addrs[h1] if source else testbed.bridge_addr]
        assert server.stdout.readline().strip() == (testbed.addrs[h1] if source else testbed.bridge_addr)
        assert server.wait(timeout=5) == 0


def test_names_missing_from_etc_hosts_fail_at_once_in_a_namespace(testbed: Bed):
    """The name servers cannot be reached from a namespace: a lookup must not wait for the resolver's timeouts."""
    done = run(testbed.exec_argv(testbed.names[0], ["getent", "hosts", "no-such-host.invalid"]), timeout=3)
    assert done.returncode == 2  # not found


def test_decoy_is_listed_first_and_reaches_nothing(testbed: Bed):
    h1, h2 = testbed.names[:2]
    names = [link["ifname"] for link in links(testbed, h1)]
    lan, decoy_if = testbed.host(h1).ifname, testbed.host(h1).decoy_ifname
    decoy1, decoy2 = testbed.host(h1).decoy_addr, testbed.host(h2).decoy_addr
    assert decoy_if is not None
    assert names.index(decoy_if) < names.index(lan), names
    decoy = next(link for link in links(testbed, h1) if link["ifname"] == decoy_if)
    assert "UP" in decoy["flags"]
    assert [a["local"] for a in decoy["addr_info"] if a["family"] == "inet"] == [decoy1]
    assert ipaddress.ip_address(decoy1) not in ipaddress.ip_network(testbed.subnet)
    # the other host and the root namespace are reached through lan0, the other decoy "through" decoy0 ...
    assert route_dev(testbed, h1, testbed.addrs[h2]) == lan
    assert route_dev(testbed, h1, testbed.bridge_addr) == lan
    assert route_dev(testbed, h1, decoy2) == decoy_if
    # ... which drops everything: no connection even to a port that is listening on every address of h2
    server = subprocess.Popen(testbed.exec_argv(h2, [sys.executable, "-c", LISTENER, "0.0.0.0"]),
                              stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        assert connect_from(testbed, h1, decoy2, port, timeout=1).returncode != 0
        assert ok(connect_from(testbed, h1, testbed.addrs[h2], port)).startswith("hello")
        assert server.wait(timeout=5) == 0
    finally:
        server.kill()
        server.wait()


def test_exec_runs_in_the_namespace_and_passes_the_exit_status(testbed: Bed):
    h = testbed.names[1]
    done = run(bed_cmd("exec", "--state", str(testbed.state), h, "--", "sh", "-c", f"{LAN_ADDR}; exit 7"))
    assert (done.returncode, done.stdout.strip()) == (7, testbed.addrs[h]), done.stderr


# --------------------------------------------------------------------------- open mpi


def test_rsh_agent_runs_commands_in_the_host_like_ssh(testbed: Bed):
    h = testbed.names[0]
    done = run([testbed.rsh_agent, "-x", "-o", "BatchMode=yes", f"root@{testbed.addrs[h]}",
                LAN_ADDR, "&&", "exit", "3"])
    assert (done.returncode, done.stdout.strip()) == (3, testbed.addrs[h]), done.stderr
    assert run([testbed.rsh_agent, "nosuchhost", "true"]).returncode == 255


def test_mpirun_runs_ranks_in_both_namespaces(testbed: Bed):
    h1, h2 = testbed.names[:2]
    out = ok(run(["mpirun", *testbed.mpirun_args, "-H", f"{h1}:2,{h2}:1", "sh", "-c",
                  "echo $OMPI_COMM_WORLD_RANK $OMPI_COMM_WORLD_LOCAL_RANK $OMPI_COMM_WORLD_SIZE "
                  f"$OMPI_COMM_WORLD_LOCAL_SIZE $({LAN_ADDR})"], env=testbed.env(), timeout=60))
    ranks = sorted(tuple(line.split()) for line in out.splitlines())
    a1, a2 = testbed.addrs[h1], testbed.addrs[h2]
    assert ranks == [("0", "0", "3", "2", a1), ("1", "1", "3", "2", a1), ("2", "0", "3", "1", a2)], out


def test_mpi_messages_cross_the_hosts(testbed: Bed, tmp_path):
    """A real MPI program (allreduce, sendrecv around a ring): the transports use the lan, not the decoys."""
    if shutil.which("mpicc") is None:
        unavailable("no mpicc: run scripts/system_packages.sh --dev")
    (tmp_path / "ring.c").write_text(RING_C)
    ok(run(["mpicc", "-o", str(tmp_path / "ring"), str(tmp_path / "ring.c")], timeout=120))
    h1, h2 = testbed.names[:2]
    out = ok(run(["mpirun", *testbed.mpirun_args, "-H", f"{h1}:2,{h2}:1", str(tmp_path / "ring")],
                 env=testbed.env(), timeout=60))
    assert sorted(tuple(map(int, line.split())) for line in out.splitlines()) == \
        [(0, 3, 3, 2), (1, 3, 3, 0), (2, 3, 3, 1)], out


# --------------------------------------------------------------------------- sshd


def ssh(bed: Bed, host: str, command: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return run(["ssh", "-F", bed.ssh_config, "-o", "BatchMode=yes", host, "--", command], timeout=timeout)


def test_ssh_logs_in_to_each_host_in_its_own_namespace_and_passes_the_exit_status(testbed: Bed):
    for h in testbed.names:
        done = ssh(testbed, h, f"{LAN_ADDR}; exit 5")
        assert (done.returncode, done.stdout.strip()) == (5, testbed.addrs[h]), done.stderr


def test_a_login_runs_without_this_machines_bashrc(testbed: Bed):
    """A fresh host: the commands sshd runs (bash reads ~/.bashrc for them) see an empty one on every host, whatever
    this machine's holds (its pyenv init costs some 200 processes a login); the root namespace keeps its own."""
    bashrc = Path.home() / ".bashrc"
    for h in testbed.names:
        said = ok(ssh(testbed, h, f"wc -c < {bashrc} 2>/dev/null || echo none"))
        assert said.strip() == ("0" if bashrc.exists() else "none"), said


def test_a_login_says_the_hosts_share_the_cores_as_the_tests_shell_does(testbed: Bed):
    """The hosts are namespaces of one machine: a login's processes take a thread each (OMP_NUM_THREADS=1), as the
    processes the tests start from their own shell do (tests/runs.py, SHARED_CORES)."""
    for h in testbed.names:
        assert ok(ssh(testbed, h, "echo $OMP_NUM_THREADS")) == SHARED_CORES["OMP_NUM_THREADS"] + "\n"


def test_the_common_home_is_a_different_folder_on_each_host(testbed: Bed):
    """The same path is each host's own folder (a private mount namespace per host), and the root namespace's is
    none of theirs: as on separate machines that do not share a file system."""
    home = testbed.ssh["home"]
    tag = uuid.uuid4().hex[:8]  # other tests use the homes meanwhile (the bed is shared): only this test's files
    for h in testbed.names:
        (testbed.home_of(h) / f"only-on-{h}-{tag}").write_text(h)
    try:
        for h in testbed.names:
            mine = [f for f in ok(ssh(testbed, h, f"ls -A {home}")).split() if f.endswith(f"-{tag}")]
            assert mine == [f"only-on-{h}-{tag}"]
        assert not [p for p in Path(home).iterdir() if p.name.endswith(f"-{tag}")]
    finally:
        for h in testbed.names:
            (testbed.home_of(h) / f"only-on-{h}-{tag}").unlink()


def test_a_host_without_the_key_refuses_the_login(testbed: Bed, tmp_path):
    config = testbed.ssh_config_refused_by(testbed.names[1], tmp_path)
    login = ["ssh", "-F", config, "-o", "BatchMode=yes"]
    done = run([*login, testbed.names[1], "--", "true"])
    assert done.returncode == 255 and "Permission denied (publickey)" in done.stderr, done.stderr
    assert run([*login, testbed.addrs[testbed.names[1]], "--", "true"]).returncode == 255  # by address too
    assert ok(run([*login, testbed.names[0], "--", "echo in"])) == "in\n"  # the other host takes the same config


# --------------------------------------------------------------------------- the data network


def bed_layout(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """scripts/bed/layout.py, imported as testbed.py imports it (its folder first on sys.path)."""
    monkeypatch.syspath_prepend(str(TESTBED.parent))
    return importlib.import_module("bed.layout")


@pytest.mark.unit
def test_a_data_network_gets_a_subnet_of_its_own_and_interface_names_that_fit(monkeypatch):
    """Its subnet overlaps neither the lan's, the decoys' nor the machine's networks; each host's data address is
    numbered as its lan address; every interface name fits at the longest prefix and the most hosts allowed; and a
    plan.json from before the data network still loads (`down` must undo it)."""
    layout = bed_layout(monkeypatch)
    taken = ipaddress.ip_network("10.0.0.0/9")  # half of 10/8: the picks must go around it
    monkeypatch.setattr(layout, "used_networks", lambda: [taken])
    monkeypatch.setattr(layout, "nameservers", lambda: [])
    monkeypatch.setattr(layout, "name_taken", lambda tag: False)
    prefix = "t" * (layout.IFNAMSIZ - layout.ID_HEX - len(f"d{layout.MAX_HOSTS}"))
    layout.check_prefix(prefix, layout.MAX_HOSTS)
    with pytest.raises(layout.TestbedError, match="too long"):
        layout.check_prefix(prefix + "t", layout.MAX_HOSTS)
    args = argparse.Namespace(prefix=prefix, hosts=layout.MAX_HOSTS, cpus=1, slurm=False, slurmd_timeout=30,
                              sshd=False, decoy=True, data_network=True)
    plan = layout.make_plan(args, Path("/nonexistent"))
    lan, decoy, data = (ipaddress.ip_network(n) for n in (plan.subnet, plan.decoy_subnet, plan.data_subnet))
    for one, other in ((data, lan), (data, decoy), (data, taken), (lan, decoy), (lan, taken), (decoy, taken)):
        assert not one.overlaps(other), (one, other)
    assert plan.data_bridge_addr == str(data[1])
    assert all((h.addr, h.data_addr) == (str(lan[10 + h.index]), str(data[10 + h.index])) for h in plan.hosts)
    names = [plan.bridge, plan.data_bridge, *(name for h in plan.hosts for name in (h.veth, h.data_veth))]
    assert len(set(names)) == len(names) and max(map(len, names)) == layout.IFNAMSIZ, names
    assert layout.Plan.from_json(plan.to_json()) == plan
    written_before = plan.to_json()
    del written_before["data_subnet"]
    for h in written_before["hosts"]:
        del h["data_addr"], h["data_veth"]
    older = layout.Plan.from_json(written_before)
    assert older.data_subnet is None and {(h.data_addr, h.data_veth) for h in older.hosts} == {(None, None)}


def reaches(bed: Bed, source: str, addr: str, within: float = 2) -> bool:
    """One ping from ``source``'s namespace to ``addr`` answered within ``within`` seconds (the answer ends it)."""
    return run(bed.exec_argv(source, ["ping", "-c1", f"-W{within:g}", addr])).returncode == 0


def test_the_data_network_is_cut_between_two_hosts_or_at_one_while_the_lan_answers(tmp_path):
    with bed_of_its_own(tmp_path / "bed", "--hosts", "3", "--data-network", "--prefix", "tbdn") as bed:
        h1, h2, h3 = bed.names
        data = bed.data_addrs
        assert ipaddress.ip_address(data[h1]) in ipaddress.ip_network(bed.data_subnet)
        assert not ipaddress.ip_network(bed.data_subnet).overlaps(ipaddress.ip_network(bed.subnet))
        assert route_dev(bed, h1, data[h2]) == bed.host(h1).data_ifname == "data0"
        defaults = json.loads(ok(run(bed.exec_argv(h1, ["ip", "-j", "route", "show", "default"]))))
        assert [r["dev"] for r in defaults] == [bed.host(h1).ifname], defaults  # none through the data network
        assert reaches(bed, h1, data[h2]) and reaches(bed, h1, data[h3])

        data_cut_between(bed, h2, h3, cut=True)
        try:
            assert not reaches(bed, h2, data[h3], within=1) and not reaches(bed, h3, data[h2], within=1)
            assert reaches(bed, h2, bed.addrs[h3]) and reaches(bed, h2, data[h1]) and reaches(bed, h1, data[h3])
        finally:
            data_cut_between(bed, h2, h3, cut=False)
        assert reaches(bed, h2, data[h3])
        data_cut_between(bed, h2, h3, cut=False)  # undoing it twice is fine

        data_link(bed, h1, up=False)
        try:
            assert not reaches(bed, h2, data[h1], within=1)
            assert reaches(bed, h2, bed.addrs[h1])
        finally:
            data_link(bed, h1, up=True)
        wait_until(lambda: reaches(bed, h2, data[h1], within=1), 10, f"{h1}'s data address answering again")


# --------------------------------------------------------------------------- down


def test_down_removes_namespaces_processes_and_hosts_lines(tmp_path):
    reason = missing_requirements(slurm=False, sshd=True)
    if reason:
        unavailable(reason)
    state = tmp_path / "bed"
    description = bed_up(state, "--hosts", "1", "--sshd", "--prefix", "tbd")
    (host,) = description["hosts"]
    inodes = namespace_inodes(description)
    assert host["name"] in run(["ip", "netns", "list"]).stdout
    assert f"{host['addr']}\t{host['name']}\t{description['hosts_marker']}" in open("/etc/hosts").read()
    sleeper = subprocess.Popen(bed_cmd("exec", "--state", str(state), host["name"], "--",
                                       "sh", "-c", "echo inside; exec sleep 600"), stdout=subprocess.PIPE, text=True)
    try:
        assert sleeper.stdout.readline() == "inside\n"
        sshd = int(description["ssh"]["hosts"][host["name"]]["sshd_pid"])
        assert "sshd_config" in " ".join(open(f"/proc/{sshd}/cmdline").read().split("\0"))
        ok(bed_down(state))
        assert not Path(f"/proc/{sshd}/cmdline").exists() or not open(f"/proc/{sshd}/cmdline").read()  # stopped
        assert sleeper.wait(timeout=5) != 0  # killed: it was inside the namespace
    finally:
        sleeper.kill()
        sleeper.wait()
    assert host["name"] not in run(["ip", "netns", "list"]).stdout
    assert description["hosts_marker"] not in open("/etc/hosts").read()
    assert leftovers(description, inodes) == []
    ok(bed_down(state))  # idempotent
