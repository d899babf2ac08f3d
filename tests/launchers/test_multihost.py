"""Several hosts for real: network-namespace hosts of the test bed (each with its own address and a
decoy interface listed before the one that reaches the others), launched by hand on each host
(launcher=manual) and by mpirun from the root namespace (launcher=mpi, Open MPI's plm_rsh_agent enters
the namespaces). Nobody sets GLOO_SOCKET_IFNAME: the runner's interface choice is what makes the jobs
work, as the control test shows."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import environment, validate
from runner.launchers import Invocation, plan_for
from runner.launchers.mpi import MpiLauncher
from runner.records.paths import RunPaths
from runs import (SNAPSHOT, artifacts, bed_hosts, check_views, mpi_options, nothing_left, on_each_host, processes_of,
                  run, run_folder, running, wait_for_pids, wait_until)

pytestmark = pytest.mark.timeout(240)


def placement(out_dir: Path) -> list[str]:
    return ["recipe=custom", "recipe.target=workloads.placement:main", f"+recipe.out_dir={out_dir}"]


def check_hosts(testbed, art: Path, counts: list[int]) -> dict[int, dict]:
    """Ranks 0.. ran on the bed's hosts in plan order (their host's lan address among their addresses)
    and the all-reduce over all of them summed 1 + ... + world."""
    found = artifacts(art)
    world = sum(counts)
    assert sorted(found) == list(range(world)), found
    rank = 0
    for host, n in zip(testbed.hosts, counts):
        for _ in range(n):
            assert host.addr in found[rank]["addrs"], (rank, host, found[rank])
            assert found[rank]["sum"] == world * (world + 1) / 2
            rank += 1
    return found


@pytest.mark.parametrize("init", ["tcp", "file"])
def test_manual_launch_on_each_host(testbed, tmp_path, init):
    art = tmp_path / "art"
    art.mkdir()
    shared = tmp_path / "rdzv"
    shared.mkdir()
    run_id = f"m{uuid.uuid4().hex[:8]}"
    overrides = [*bed_hosts(testbed, [2, 2]), "launcher=manual", f"init={init}", *placement(art)]
    if init == "file":
        overrides.append(f"init.dir={shared}")
    results = on_each_host(testbed, tmp_path, overrides, run_id)
    assert [code for code, _ in results] == [0, 0], results
    check_hosts(testbed, art, [2, 2])
    check_views(art, run_folder(tmp_path) / "spec.yaml", 4)  # both hosts' `run`s share this folder here
    logs = sorted(tmp_path.glob("outputs/*/*/logs/rank00002.log"))
    assert logs and "GLOO_SOCKET_IFNAME=lan0" in logs[0].read_text()
    assert "the interface of the route to the master" in logs[0].read_text()
    nothing_left(run_id)


@pytest.mark.parametrize("init, tasks, counts", [
    ("tcp", "per_device", [2, 1]),
    ("file", "per_device", [2, 2]),
    ("env", "per_host", [2, 2]),
])
def test_mpirun_across_hosts(testbed, tmp_path, init, tasks, counts):
    art = tmp_path / "art"
    art.mkdir()
    done = run(*bed_hosts(testbed, counts), *mpi_options(testbed), f"init={init}", f"launcher.tasks={tasks}",
               f"recipe.global_batch_size={sum(counts) * 10}", *placement(art), *SNAPSHOT, cwd=tmp_path,
               env=testbed.env())
    assert done.code == 0, done.output
    assert "mpi: mpirun " in done.stderr
    found = check_hosts(testbed, art, counts)
    check_views(art, run_folder(tmp_path) / "spec.yaml", sum(counts))
    assert {rec["master_addr"] for rec in found.values()} == {testbed.hosts[0].name}  # rank 0's host
    nothing_left(done.run_id)


def test_control_without_the_runners_interface_choice_the_same_job_fails(testbed, tmp_path):
    """backend.pick_interface=false leaves gloo to its own devices: in a namespace host the machine's host
    name resolves to an address the host does not have, gloo falls back to loopback, and the hosts
    cannot connect. The success above is the runner's doing."""
    art = tmp_path / "art"
    art.mkdir()
    started = time.monotonic()
    done = run(*bed_hosts(testbed, [2, 2]), *mpi_options(testbed), "init=tcp", "launcher.tasks=per_device",
               "backend.pick_interface=false", "init.timeout_s=30", *placement(art), cwd=tmp_path,
               env=testbed.env(), timeout=180)
    assert done.code == 1, done.output
    # DESIGN.md's symptom: the first rank to fail had its mesh on the loopback address its peer published (it
    # dialed it: "remote=[127.0.0.1]", or its loopback peer went away: "Connection closed by peer [127.0.0.1]"),
    # and so did every rank whose mesh failed to connect; others may have failed after it (lost the rendezvous
    # store with rank 0) or been killed by their launcher
    records = sorted((record for p in tmp_path.glob("outputs/*/*/logs/rank*.error.json")
                      if not (record := json.loads(p.read_text())).get("killed")), key=lambda record: record["timestamp"])
    told = "\n\n".join(f"rank {r['rank']}: {r['exception']}" for r in records)
    looped = ["Gloo connectFullMesh failed" in r["exception"] and "[127.0.0.1]" in r["exception"] for r in records]
    assert records and looped[0], told  # its mesh was on loopback
    # the others' meshes failed on loopback too (refused, or "Connection closed by peer [127.0.0.1]")
    assert all(ok for r, ok in zip(records, looped) if "connectFullMesh" in r["exception"]), told
    assert not artifacts(art)
    assert time.monotonic() - started < 120
    nothing_left(done.run_id)


def test_nothing_of_an_mpirun_job_outlives_run_when_it_is_killed(testbed, tmp_path):
    """SIGKILL to `run` itself, which can pass nothing on: mpirun is signalled as `run` dies (it runs in a process
    group of its own, out of reach of a Ctrl-C at the terminal), and its own stop ends every task and rank on both
    hosts."""
    out = tmp_path / "out"
    out.mkdir()
    with running(*bed_hosts(testbed, [1, 1]), *mpi_options(testbed), "launcher.tasks=per_device", "recipe=custom",
                 "recipe.target=workloads.failing:main", f"+recipe.out_dir={out}", "+recipe.fail_rank=-1",
                 "+recipe.fail_step=0", cwd=tmp_path, env=testbed.env()) as proc:
        wait_for_pids(proc, out, 2)
        found = processes_of(proc.run_id)  # mpirun, and each host's task, its zygote and its rank (forked from the
        # zygote: the same command, which ends with the task's own)
        assert sum(p.name() == "mpirun" for p in found) == 1 and sum("-m" in p.cmdline() for p in found) >= 2, found
        assert sum(p.cmdline()[1:3] == ["-u", "-c"] for p in found) >= 4, found
        proc.reap()
    wait_until(lambda: not processes_of(proc.run_id), 30, "nothing of the run left on any host")


STAND_IN = """
import ctypes, os, sys
death = ctypes.c_int()
ctypes.CDLL(None).prctl(2, ctypes.byref(death), 0, 0, 0)  # PR_GET_PDEATHSIG
with open(sys.argv[1], "w") as f:
    print(os.getpid(), os.getpgid(0), os.readlink("/proc/self/fd/0"), death.value, file=f)
"""


def test_mpirun_has_no_terminal_input_a_process_group_of_its_own_and_dies_with_run(tmp_path) -> None:
    """A Ctrl-C at the terminal reaches the foreground process group: `run` alone, which passes it on. mpirun reads
    the terminal (it forwards input to rank 0), which would stop it in a group of its own; and it must not outlive
    `run`. (A Python stand-in for mpirun says what it was given.)"""
    seen, paths = tmp_path / "seen", RunPaths(tmp_path, "R1")
    job = validate(("launcher=mpi", "device=cpu", "topology=1x2")).job
    chosen = MpiLauncher(plan=plan_for(job, paths), paths=paths, environment=environment(),
                         invocation=Invocation(python=sys.executable, cwd=str(tmp_path)))
    code = chosen._run_mpirun([sys.executable, "-c", STAND_IN, str(seen)], str(tmp_path), dict(os.environ))
    pid, pgid, stdin, death = seen.read_text().split()
    assert code == 0 and (pgid, stdin, int(death)) == (pid, "/dev/null", signal.SIGTERM)
