"""`run ... preflight=true` here and on the Slurm test bed (scripts/testbed.py): one line per host, a closed port
and a loopback master caught fast, with the address, the port and a hint. The checks one by one:
tests/worker/preflight/test_checks.py."""

from __future__ import annotations

import re
import socket
import time

import pytest

from runs import nothing_left, run, run_folder

pytestmark = pytest.mark.timeout(240)


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
    nothing_left(done.run_id)


def test_preflight_on_this_machine_with_the_port_taken(tmp_path):
    with socket.socket() as taken:  # another job's store, listening on the port
        taken.bind(("127.0.0.1", 0))
        taken.listen(8)
        port = taken.getsockname()[1]
        started = time.monotonic()
        done = run("topology=1x2", "init=tcp", f"init.master_port={port}", "preflight=true", cwd=tmp_path)
    assert done.code == 1, done.output
    assert f"FAILED: port {port} is not free on this host (host 0): cannot listen on 127.0.0.1:{port}" in done.stdout
    assert "hint: another job holds the port" in done.stdout
    assert time.monotonic() - started < 30
    assert not list((run_folder(tmp_path) / "logs").glob("rank*.log"))  # no rank started
    nothing_left(done.run_id)


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
    hang: the kernel's SYN retries outlast the group's timeout, so the preflight gives up at its deadline. (With the
    data-network check off: the check names such a host first, below.)"""
    started = time.monotonic()
    done = run("topology=2x2", "launcher=slurm", "backend.socket_ifname=decoy0", "init.timeout_s=40", "preflight=true",
               "backend.pair_check_s=0", cwd=tmp_path, env=testbed.env())  # (40 s: host 1 waits that long for host
    # 0's store to open the attempt, and beside the suite's other workers on 2 cores host 0's `run` has started over
    # 20 s after it)
    elapsed = time.monotonic() - started
    assert done.code not in (0, 2), done.output
    failed = [line for line in host_lines(done.output) if "FAILED" in line]
    assert failed, done.output
    assert "gloo/NCCL on decoy0 (backend.socket_ifname; the route leaves via lan0)" in done.output
    # the group's timeout, min(init.timeout_s, 30 s), + 5 s
    assert "gloo all-reduce over 4 process(es): not done after 35 s" in failed[0], failed
    assert "hint: firewall or interface" in failed[0]
    assert elapsed < 110, elapsed  # (the group's timeout, not the kernel's SYN retries: over two minutes)


def test_an_interface_that_reaches_nothing_is_named_by_the_data_network_check_before_any_rank_starts(testbed, tmp_path):
    """The same decoy interface with the data-network check on (its default), under Slurm: each host's dial of the
    other over it gets no answer within backend.pair_check_s, host 1 is named (the tie rule) on both hosts, and the job
    ends before any rank starts, in seconds, not at the group's timeout."""
    done = run("topology=2x2", "launcher=slurm", "backend.socket_ifname=decoy0", "init.timeout_s=60", cwd=tmp_path,
               env=testbed.env())
    assert done.code == 1, done.output
    named = re.findall(r"error: network: host 1 \(node1\) failed the data-network check before attempt 1 \(1 of the "
                       r"failed pair\(s\): host 0 \(node0\) and host 1 \(node1\): 0 -> 1: no answer from \S+ within 5 s, "
                       r"1 -> 0: no answer from \S+ within 5 s\); hint: check that host's data interface", done.output)
    assert len(named) == 2, done.output  # (each host says it: the job does not outlive its hosts)
    assert "no rank started" in done.output and "process group did not form" not in done.output, done.output
