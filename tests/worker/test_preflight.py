"""preflight=true: each host's checks with real sockets of this machine, then `run ... preflight=true`
here and on the Slurm test bed (scripts/testbed.py): one line per host, a closed port and a loopback
master caught fast, with the address, the port and a hint."""

from __future__ import annotations

import errno
import re
import socket
import time

import pytest

from runner.worker.preflight.checks import (
    Check,
    HostChecks,
    check_devices,
    check_init_folder,
    check_interface,
    check_master,
    check_reachable,
    connect_failure,
    hold_port,
)
from runner.worker.network import InterfaceChoice
from runner.spec.schema import DeviceKind
from runner.spec.topology import Host
from runs import processes_of, run, run_folder

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def closed_port():
    """A port of 127.0.0.1 nobody listens on (held bound, so no one else takes it meanwhile)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@pytest.fixture
def listening_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s.getsockname()[1]


# -------------------------------------------------------------------------- the checks, with real sockets


@pytest.mark.unit
def test_a_closed_port_is_refused_with_its_address_and_port(closed_port):
    check = check_reachable("127.0.0.1", closed_port, window_s=0, ifname="lo")
    assert not check.ok
    assert f"port {closed_port} on 127.0.0.1 (reached via lo) refused the connection: nothing listens there" in \
        check.failure
    assert "is host 0 started" in check.hint and "init.master_addr" in check.hint and "firewall" in check.hint


@pytest.mark.unit
def test_a_refused_port_is_tried_again_for_the_window_then_given_up(closed_port):
    started = time.monotonic()
    check = check_reachable("127.0.0.1", closed_port, window_s=1.0)
    assert 1.0 <= time.monotonic() - started < 5
    assert "refused the connection for 1 s" in check.failure


@pytest.mark.unit
def test_host_0_that_cannot_reach_its_own_store_names_the_master_address(closed_port):
    check = check_reachable("127.0.0.1", closed_port, window_s=30, serving_here=True)  # no retry: it would not help
    assert "this host (host 0) serves the rendezvous" in check.failure
    assert "the master address leads elsewhere" in check.failure
    assert "init.master_addr must be host 0's address" in check.hint


@pytest.mark.unit
def test_a_listening_port_is_reachable(listening_port):
    assert check_reachable("127.0.0.1", listening_port, window_s=0) == Check(f"port {listening_port} reachable")


@pytest.mark.unit
def test_a_bound_port_is_not_free_and_a_free_one_is_held_for_the_checks(listening_port):
    sock, check = hold_port("127.0.0.1", listening_port)
    assert sock is None and not check.ok
    assert f"port {listening_port} is not free" in check.failure and f"127.0.0.1:{listening_port}" in check.failure
    assert "init.master_port=0" in check.hint
    sock, check = hold_port("127.0.0.1", 0)
    try:
        port = sock.getsockname()[1]
        assert check.ok
        served = check_reachable("127.0.0.1", port, window_s=0, serving_here=True)
        assert served.text == f"port {port} free and served here"
    finally:
        sock.close()


@pytest.mark.unit
def test_timeouts_and_unreachable_networks_point_to_firewall_and_routing():
    timeout = connect_failure("10.0.0.11", 23456, TimeoutError("timed out"), "lan0", 3.0, False)
    assert "no answer from 10.0.0.11:23456" in timeout.failure and "(reached via lan0)" in timeout.failure
    assert timeout.hint.startswith("firewall") and "port 23456" in timeout.hint
    unreachable = connect_failure("10.0.0.11", 23456, OSError(errno.EHOSTUNREACH, "No route to host"), "lan0", 0, False)
    assert "unreachable" in unreachable.failure and unreachable.hint.startswith("interface or routing")


@pytest.mark.unit
def test_a_loopback_master_with_several_hosts_is_refused_on_the_others():
    check, ip = check_master("localhost", hosts=2, one_machine=False, master_host=False)
    assert ip is None and not check.ok
    assert "the master address localhost -> 127.0.0.1 is loopback, but the job has 2 hosts" in check.failure
    assert check.hint.startswith("name resolution") and "init.master_addr" in check.hint


@pytest.mark.parametrize("hosts, one_machine, master_host, why", [
    (1, False, False, "loopback: one host"),
    (2, True, False, "loopback: every host is this machine"),
    (2, False, True, "loopback here, on host 0 itself"),  # Debian's 127.0.1.1 for the host's own name
])
@pytest.mark.unit
def test_a_loopback_master_is_fine_where_nobody_else_dials_it(hosts, one_machine, master_host, why):
    check, ip = check_master("localhost", hosts, one_machine, master_host)
    assert check.ok and ip == "127.0.0.1" and check.text == f"master localhost -> 127.0.0.1 ({why})"


@pytest.mark.unit
def test_a_master_name_that_does_not_resolve_hints_at_name_resolution():
    check, ip = check_master("no-such-host.invalid", hosts=2, one_machine=False, master_host=False)
    assert ip is None and "'no-such-host.invalid' does not resolve" in check.failure
    assert check.hint.startswith("name resolution") and "/etc/hosts" in check.hint


@pytest.mark.unit
def test_the_interface_gloo_would_use_is_checked():
    route = InterfaceChoice({"GLOO_SOCKET_IFNAME": "lan0", "NCCL_SOCKET_IFNAME": "lan0"}, "network: ...")
    assert check_interface(route, "lan0", None, None, "gloo", frozenset({"lo", "lan0"}), None, False).text == \
        "gloo/NCCL on lan0 (the route's)"
    named = InterfaceChoice({"GLOO_SOCKET_IFNAME": "ib0", "NCCL_SOCKET_IFNAME": "ib0"}, "network: ...")
    missing = check_interface(named, "lan0", "ib0", None, "gloo", frozenset({"lo", "lan0"}), None, False)
    assert "interface ib0 (backend.socket_ifname) is not on this host (it has lan0, lo)" in missing.failure
    assert "the route's: lan0" in missing.hint
    left = InterfaceChoice({}, "network: backend.pick_interface=false: gloo and NCCL choose their interface")
    own_loopback = check_interface(left, "lan0", None, None, "gloo", frozenset({"lo", "lan0"}), "127.0.1.1", False,
                                   pick_interface=False)
    assert "gloo picks its interface itself (backend.pick_interface=false) and would listen on 127.0.1.1, the " \
           "loopback address this host's name resolves to" in own_loopback.failure
    assert "backend.pick_interface=true" in own_loopback.hint and "backend.socket_ifname (lan0)" in own_loopback.hint
    assert check_interface(left, "lan0", None, None, "gloo", frozenset({"lan0"}), "10.0.0.12", False, False).ok


@pytest.mark.unit
def test_devices_and_the_init_folder(tmp_path):
    host = Host(1, None, None, 2, (0, 1))
    assert check_devices(host, DeviceKind.cpu, 2, 2, None).text == "2 CPU process(es) as the spec says"
    assert check_devices(host, DeviceKind.cuda, 2, 2, 8).text == "2 GPU(s) as the spec says (GPUs 0,1 of 8)"
    few = check_devices(host, DeviceKind.cuda, 2, 2, 1)
    assert "gives this host 2 GPU(s) (GPUs 0,1), but torch.cuda.device_count() = 1" in few.failure
    assert check_init_folder(tmp_path).ok
    assert not list(tmp_path.iterdir())  # its probe file is gone
    gone = check_init_folder(tmp_path / "missing")
    assert "does not exist on this host" in gone.failure and gone.hint.startswith("shared storage")


@pytest.mark.unit
def test_a_host_line_lists_its_checks_and_ends_at_a_failure():
    report = HostChecks("preflight node1 (h2, 10.0.0.12)", (Check("master h1 -> 10.0.0.11 (not loopback)"),))
    assert report.line() == "preflight node1 (h2, 10.0.0.12): master h1 -> 10.0.0.11 (not loopback)"
    failed = report.add(Check.failed("port 1 refused", "a firewall?"))
    assert failed.failed and failed.line().endswith(" · FAILED: port 1 refused — hint: a firewall?")


# -------------------------------------------------------------------------- this machine


def test_preflight_on_this_machine_runs_no_recipe(tmp_path):
    done = run("topology=1x2", "preflight=true", cwd=tmp_path)
    assert done.code == 0, done.output
    lines = [line for line in done.stdout.splitlines() if line.startswith("preflight ")]
    assert len(lines) == 1, done.output
    assert lines[0].startswith("preflight node0 (")
    assert "master 127.0.0.1 (loopback: one host)" in lines[0] and "port " in lines[0]
    assert "2 CPU process(es) as the spec says" in lines[0]
    assert "gloo all-reduce over 2 process(es) ok (sum 3," in lines[0]
    folder = run_folder(tmp_path)
    assert not (folder / "metrics.jsonl").exists() and not (folder / "checkpoints").exists()  # digits never ran
    assert not processes_of(done.run_id)


def test_preflight_on_this_machine_with_the_port_taken(tmp_path, listening_port):
    started = time.monotonic()
    done = run("topology=1x2", "init=tcp", f"init.master_port={listening_port}", "preflight=true", cwd=tmp_path)
    assert done.code == 1, done.output
    assert f"FAILED: port {listening_port} is not free on this host (host 0): cannot listen on " \
        f"127.0.0.1:{listening_port}" in done.stdout
    assert "hint: another job holds the port" in done.stdout
    assert time.monotonic() - started < 30
    assert not list((run_folder(tmp_path) / "logs").glob("rank*.log"))  # no rank started
    assert not processes_of(done.run_id)


# -------------------------------------------------------------------------- the Slurm test bed


def salloc(testbed, nodes: int, per_node: int) -> tuple[str, ...]:
    return ("salloc", f"--nodes={nodes}", f"--ntasks-per-node={per_node}", f"--partition={testbed.partition}")


def port_of(output: str) -> str:
    return re.search(r"port (\d+)", output).group(1)


def host_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("preflight ")]


@pytest.mark.parametrize("tasks, how, init", [
    ("per_host", "sbatch", "env"),
    ("per_device", "salloc", "tcp"),
    ("per_host", "salloc", "file"),
])
def test_preflight_on_two_slurm_hosts(testbed, tmp_path, tasks, how, init):
    prefix = salloc(testbed, 2, 2) if how == "salloc" else ()
    done = run("topology=2x2", "launcher=slurm", f"launcher.tasks={tasks}", f"init={init}", "preflight=true",
               cwd=tmp_path, env=testbed.env(), prefix=prefix)
    assert done.code == 0, done.output
    lines = host_lines(done.stdout)
    assert len(lines) == 2, done.output  # one per host: its local rank 0's
    first, second = testbed.hosts
    by_host = {h.name: [line for line in lines if line.startswith(f"preflight node{i} ({h.name}, {h.addr}): ")]
               for i, h in enumerate(testbed.hosts)}
    assert [len(found) for found in by_host.values()] == [1, 1], lines
    for host in testbed.hosts:
        (line,) = by_host[host.name]
        assert f"master {first.name} -> {first.addr} (not loopback)" in line
        assert f"route via lan0 ({host.addr})" in line and "gloo/NCCL on lan0 (the route's)" in line  # not decoy0
        assert "2 CPU process(es) as the spec says" in line
        assert "gloo all-reduce over 4 process(es) ok (sum 10," in line
    if init == "file":
        assert all(re.search(r"init file folder \S+ writable", line) for line in lines), lines
    else:
        assert re.search(r"port \d+ free and served here", by_host[first.name][0])
        assert re.search(r"port \d+ reachable", by_host[second.name][0])
    assert not (run_folder(tmp_path) / "metrics.jsonl").exists()


def test_preflight_catches_a_closed_port_fast(testbed, tmp_path):
    """The master address is the second host's, where nothing listens: host 0 serves the store on its own
    port, and the connection to the address the others would dial is refused."""
    other = testbed.hosts[1].addr
    started = time.monotonic()
    done = run("topology=2x2", "launcher=slurm", "init=tcp", f"init.master_addr={other}", "preflight=true",
               cwd=tmp_path, env=testbed.env())
    elapsed = time.monotonic() - started
    assert done.code not in (0, 2), done.output  # srun's status: 1, or 143 for the task --kill-on-bad-exit ended
    failed = [line for line in host_lines(done.output) if "FAILED" in line]
    assert failed, done.output
    # host 0 finds out first: the store it would serve is not where the master address leads
    assert f"port {port_of(done.output)} on {other} refused the connection" in failed[0], failed
    assert failed[0].startswith(f"preflight node0 ({testbed.hosts[0].name}, {testbed.hosts[0].addr}): ")
    assert "hint: init.master_addr must be host 0's address" in failed[0]
    assert elapsed < 60, elapsed  # init.timeout_s is 300: a failed check does not wait for it


def test_a_literal_loopback_master_with_two_hosts_is_refused_before_anything_starts(testbed, tmp_path):
    done = run("topology=2x2", "launcher=slurm", "init.master_addr=127.0.0.1", "preflight=true", cwd=tmp_path,
               env=testbed.env())
    assert done.code == 2, done.output
    assert "the master address '127.0.0.1' is loopback, but the job has 2 hosts" in done.stderr
    assert "slurm: submitted job" not in done.stderr


def test_preflight_catches_a_master_name_that_resolves_to_loopback(testbed, tmp_path):
    """The machine's host name maps to 127.0.x.x in /etc/hosts (the namespace hosts share it): validation
    cannot know, preflight resolves it on each host: host 1 would dial loopback, host 0 would serve on it."""
    name = socket.gethostname()
    if not socket.gethostbyname(name).startswith("127."):
        pytest.skip(f"this machine's name {name} does not resolve to loopback")
    started = time.monotonic()
    done = run("topology=2x2", "launcher=slurm", f"init.master_addr={name}", "preflight=true", cwd=tmp_path,
               env=testbed.env())
    assert done.code not in (0, 2), done.output
    # Both hosts check at once and the first to fail ends the step, so either diagnosis may be the one shown
    # (and the two tasks' lines may interleave in Slurm's output file under load).
    failed = [line[line.index("preflight node"):] for line in done.output.splitlines()
              if "preflight node" in line and "FAILED" in line]
    assert failed, done.output
    first, second = testbed.hosts
    for line in failed:
        if line.startswith("preflight node1 ("):
            # host 1 would dial the master's name, and it resolves to loopback
            assert line.startswith(f"preflight node1 ({second.name}): FAILED: the master address {name} -> 127."), line
            assert "is loopback, but the job has 2 hosts" in line and "hint: name resolution" in line, line
        else:
            # host 0 would serve on the loopback address its own name resolves to
            assert line.startswith(f"preflight node0 ({first.name}, 127."), line
            assert f"master {name} -> 127." in line and "(loopback here, on host 0 itself)" in line, line
            assert "the other hosts cannot connect to it" in line and "hint: interface:" in line, line
    assert time.monotonic() - started < 60


def test_an_interface_that_reaches_nothing_fails_the_all_reduce_by_its_deadline(testbed, tmp_path):
    """Every host check passes with the decoy interface named (it exists), but gloo's connections over it
    hang: the kernel's SYN retries outlast the group's timeout, so the preflight gives up at its deadline."""
    started = time.monotonic()
    done = run("topology=2x2", "launcher=slurm", "backend.socket_ifname=decoy0", "init.timeout_s=10", "preflight=true",
               cwd=tmp_path, env=testbed.env())
    elapsed = time.monotonic() - started
    assert done.code not in (0, 2), done.output
    failed = [line for line in host_lines(done.output) if "FAILED" in line]
    assert failed, done.output
    assert "gloo/NCCL on decoy0 (backend.socket_ifname; the route leaves via lan0)" in done.output
    assert "gloo all-reduce over 4 process(es): not done after 15 s" in failed[0], failed
    assert "hint: firewall or interface" in failed[0]
    assert elapsed < 60, elapsed
