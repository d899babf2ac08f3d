"""launcher=ssh on the namespace hosts of the test bed, each with a real sshd (scripts/bed/sshd.py) in a mount
namespace of its own: the job's folder is the same path on every host but a different folder (as on machines that
share no file system), and `run` started on host 0, or in the root namespace (a machine that is none of the hosts),
is the job's one terminal. Before anything starts every host is checked (a refused login, a host without `run`, a
host with another torch: refused, naming the host and the command to try); then a 2x2 and a 2+1 job of the digits
recipe and a torchrun script; a host killed mid-run, Ctrl-C, a restart, and `run` itself killed: the job ends on every
host, and nothing is left running anywhere."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import torch
import yaml

from runs import (QUIT_SAID, RUN, TESTS, artifacts, bed_hosts, check_readme_quotes, check_views, finish,
                  nothing_left, processes_of, seen_in, stage_workloads, started, Started, wait_until)
from conftest import hosts_override
from runner.environments.versions import installed

pytestmark = pytest.mark.timeout(240)

REPO = TESTS.parent


@dataclass(frozen=True)
class Job:
    """One test's job folder: the same path (under the bed's common home) on every host and here, a folder of each
    one's own; each holds the tests' workloads and the migration examples' torchrun script."""

    path: Path  # the path, as every host and the root namespace name it
    views: dict[str | None, Path]  # host (None: the root namespace) -> that folder, as the test reaches it

    def run_folder(self, host: str | None, run_id: str) -> Path:
        return self.views[host] / "outputs" / "runs" / run_id


def job_in(bed, tmp_path: Path) -> Job:
    """A job folder of its own on each of ``bed``'s hosts and here, holding the tests' workloads, as a user's checkout
    on each machine, and the migration examples' torchrun script."""
    name = f"{tmp_path.name}-{uuid.uuid4().hex[:6]}"
    views = {}
    for host in (None, *bed.names):
        folder = bed.home_of(host) / name
        folder.mkdir()
        stage_workloads(folder)
        for script in ("train_torchrun.py", "common.py"):
            shutil.copy(REPO / "examples" / "migrate" / script, folder)
        views[host] = folder
    return Job(Path(bed.ssh["home"]) / name, views)


@pytest.fixture
def job(testbed, tmp_path) -> Job:
    return job_in(testbed, tmp_path)


def ssh_options(testbed, ssh_config: str | None = None) -> list[str]:
    return ["launcher=ssh", f"launcher.ssh.config_file={ssh_config or testbed.ssh_config}", "init=tcp"]


def start(testbed, job: Job, args: list[str], run_id: str, on_host_0: bool = False,
          env: dict[str, str] | None = None, ssh_config: str | None = None) -> Started:
    """`run ARGS launcher=ssh ... run_id=...` in the job's folder (``with start(...) as proc``: reaped whatever
    happens): in the root namespace, or (``on_host_0``) on host 0, in its network and mount namespaces, where its
    run folder is host 0's; with ``ssh_config`` instead of the bed's."""
    cut = args.index("--") if "--" in args else len(args)  # a script's own arguments follow `--`
    argv = [RUN, *ssh_options(testbed, ssh_config), *args[:cut], f"run_id={run_id}", *args[cut:]]
    if on_host_0:
        h = testbed.hosts[0]
        # (nsenter --wd would open the folder before entering the mount namespace: the root namespace's)
        argv = ["nsenter", f"--net={h.netns_path}", f"--mount={testbed.mount_ns(h.name)}", "--", "/bin/sh", "-c",
                'cd "$0" && exec "$@"', str(job.path), *argv]
    return started(argv, cwd=job.views[None], env={**testbed.env(), **(env or {})}, run_id=run_id, merged=True)


def check_argv(testbed, job: Job, host: str, port: int, ssh_config: str | None = None) -> str:
    """The check's command for ``host`` (``port``: the run's master port), as `run` prints it to try by hand."""
    index, run = testbed.names.index(host), shlex.quote(RUN)
    return shlex.join(["ssh", "-T", "-F", ssh_config or testbed.ssh_config, "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o",
                       "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3", "--", host,
                       f"cd {shlex.quote(str(job.path))} && exec {run} --reach {testbed.names[0]} {port} {index}"])


def summary(job: Job, host: str | None, run_id: str) -> dict:
    return json.loads((job.run_folder(host, run_id) / "run_summary.json").read_text())


def digits(epochs: int, batch: int) -> list[str]:
    return [f"recipe.epochs={epochs}", f"recipe.global_batch_size={batch}"]


def ready(testbed) -> str:
    v = installed()
    return (rf"ssh: 2 host\(s\) ready \(runner {re.escape(v.runner)}, torch {re.escape(v.torch)}\) in \d+\.\d s: "
            rf"{testbed.names[0]}, {testbed.names[1]}")


# What `run` shows, as patterns of the hosts' names: docs/ssh.md quotes these lines
# (test_the_readme_quotes_what_these_tests_see checks it)
SAID = {
    "done": r"status    done: every rank returned \(exit 0\)",
    "refused": r"error: launcher=ssh: host 1 \({host1}\): ssh could not log in \(exit 255\): root@{host1}: Permission "
               r"denied \(publickey\)\.",
    "no run": r"error: launcher=ssh: host 1 \({host1}\): \S+/bin/run is not there or cannot run \(exit 127: ",
    "other torch": r"error: launcher=ssh: host 1 \({host1}\): runner \S+ and torch 2\.12\.0 there, runner \S+ and torch "
                   r"\S+ here",
    "unresolved": r"error: launcher=ssh: host 1 \({alias1}\): host 0's rendezvous: '{alias0}' does not resolve on "
                  r"this host \(Temporary failure in name resolution\)",
    "unresolved hint": r"    hint: give host 0 an address every host can reach and resolve: topology\.hosts\[0\]\.addr=IP "
                       r"\(or init\.master_addr\), or make the name known there \(/etc/hosts, DNS\)",
    "dialled": r"# host 0 \({alias0}\) is dialled at {addr0}: ssh -G {alias0}: HostName {addr0} \(the name is ssh's "
               r"alias\)",
    "lost": r"ssh: host 1 \({host1}\) lost: ssh exited 255 \(Connection to {host1} closed by remote host\.\): the host, "
            r"its network or its `run` is gone",
    "lost on host 0": r"\[host {host0}\] host {host1}: lost: ssh exited 255",
    "lost status": r"status    failed \(exit 1\): host 1 \({host1}\) was lost: ssh exited 255",
    "sigint": r"\[host {host1}\] SIGINT: stopping 1 process\(es\)",
    "stopped": r"status    stopped by SIGINT \(exit 130\)",
}


def seen(key: str, testbed=None, **names: str) -> str:
    """The pattern ``key`` of :data:`SAID`, for the test bed's hosts (any host name without one) and ``names``."""
    return seen_in(SAID, key, testbed, **names)


# --------------------------------------------------------------------------- jobs


def test_a_2x2_digits_job_from_host_0_is_one_terminal_one_summary_one_status(testbed, job):
    """`run` on host 0: its run folder is host 0's, host 1's ranks' logs are taken back into it, and its one summary
    counts all four ranks; host 1 kept the run in its own folder too."""
    run_id = f"a{uuid.uuid4().hex[:8]}"
    with start(testbed, job, [*bed_hosts(testbed, [2, 2]), *digits(2, 64)], run_id,
                                    on_host_0=True) as proc:
        ((code, said),) = finish([proc], timeout=200)
    assert code == 0, said
    assert re.search(ready(testbed), said) and re.search(seen("done"), said), said
    assert said.count("\n== run ") == 1  # one summary: the hosts' own `run`s print none
    assert re.search(r"final test accuracy: 0\.\d+ after 42 steps", said), said
    done = summary(job, testbed.names[0], run_id)
    assert (done["status"], done["world_size"], done["processes_per_host"]) == ("done", 4, [2, 2])
    logs = sorted(p.name for p in (job.run_folder(testbed.names[0], run_id) / "logs").glob("rank*.log"))
    assert logs == [f"rank{r:05d}.log" for r in range(4)]
    host1 = job.run_folder(testbed.names[1], run_id)
    assert sorted(p.name for p in (host1 / "logs").glob("rank*.log")) == ["rank00002.log", "rank00003.log"]
    assert (host1 / "spec.yaml").exists() and not (host1 / "checkpoints").exists()  # rank 0 checkpoints, on host 0
    nothing_left(run_id)


def test_a_2_plus_1_digits_job_from_a_machine_that_is_no_host(testbed, job):
    """`run` in the root namespace, whose folder is neither host's: host 0's records (how every rank ended, the
    metrics) and each host's logs come back over ssh, and the summary is the whole job's."""
    run_id = f"b{uuid.uuid4().hex[:8]}"
    with start(testbed, job, [*bed_hosts(testbed, [2, 1]), *digits(2, 60)], run_id) as proc:
        ((code, said),) = finish([proc], timeout=200)
    assert code == 0, said
    assert re.search(seen("done"), said) and said.count("\n== run ") == 1, said
    done = summary(job, None, run_id)
    assert (done["status"], done["processes_per_host"]) == ("done", [2, 1])
    assert done["final_metrics"]["test_accuracy"] > 0.8 and done["metrics_step"] == 44
    here = job.run_folder(None, run_id)
    assert sorted(p.name for p in (here / "logs").glob("rank*.log")) == [f"rank{r:05d}.log" for r in range(3)]
    assert sorted(p.name for p in (here / "logs").glob("rank*.done")) == [f"rank{r:05d}.done" for r in range(3)]
    nothing_left(run_id)


def test_every_rank_runs_on_its_host_sees_one_job_and_gets_the_exported_values(testbed, job, tmp_path):
    """2+1 processes of workloads/placement.py: each rank on its host (its lan address), all in one all-reduce, every
    rank's spec the one this `run` pinned and wrote (spec.yaml), in the job's folder of its host; a variable
    launcher.ssh.export names reaches every rank with its value as it is here, shell characters and all."""
    run_id = f"n{uuid.uuid4().hex[:8]}"
    art = tmp_path / "art"  # outside the bed's home: one folder for every host
    art.mkdir()
    value = "a b; $(echo no) 'quoted' \\n"
    with start(testbed, job, [*bed_hosts(testbed, [2, 1]), "recipe=custom", "recipe.target=workloads.placement:main",
                              f"+recipe.out_dir={art}", "+recipe.env=[RUNNER_SSH_PROBE]",
                              "launcher.ssh.export=[RUNNER_SSH_PROBE]", "recipe.global_batch_size=30"], run_id,
               env={"RUNNER_SSH_PROBE": value}) as proc:
        ((code, said),) = finish([proc], timeout=200)
    assert code == 0, said
    found = artifacts(art)
    hosts = [testbed.hosts[0]] * 2 + [testbed.hosts[1]]
    for rank, host in enumerate(hosts):
        assert host.addr in found[rank]["addrs"] and found[rank]["sum"] == 6.0, found[rank]
        assert found[rank]["env"] == {"RUNNER_SSH_PROBE": value}, found[rank]
    views = check_views(art, job.run_folder(None, run_id) / "spec.yaml", 3)
    assert {v["cwd"] for v in views.values()} == {str(job.path)}
    nothing_left(run_id)


def test_a_torchrun_script_runs_unchanged_with_every_ranks_output_prefixed(testbed, job):
    """examples/migrate/train_torchrun.py on 2x1, log.console=all: each rank writes its record in its own host's
    folder, and each line it prints reaches this terminal whole, prefixed with its rank and host."""
    run_id = f"c{uuid.uuid4().hex[:8]}"
    with start(testbed, job, [*bed_hosts(testbed, [1, 1]), "log.console=all", "--",
                                                   "train_torchrun.py", "--epochs", "2"], run_id) as proc:
        ((code, said),) = finish([proc], timeout=200)
    assert code == 0, said
    for rank, host in enumerate(testbed.names):
        assert f"[rank {rank} {host}] train_torchrun: rank {rank} of 2 done on cpu\n" in said, said
        record = json.loads((job.views[host] / "artifacts" / f"rank{rank}.json").read_text())
        assert (record["rank"], record["world_size"], record["sum"], record["epochs"]) == (rank, 2, 3.0, 2)
    assert not (job.views[testbed.names[0]] / "artifacts" / "rank1.json").exists()  # folders of their own
    assert summary(job, None, run_id)["status_text"] == "done: every rank returned (exit 0)"
    nothing_left(run_id)


# --------------------------------------------------------------------------- refused before anything starts


def refused(testbed, job: Job, run_id: str, key: str, ssh_config: str | None = None) -> str:
    with start(testbed, job, [*bed_hosts(testbed, [1, 1])], run_id, ssh_config=ssh_config) as proc:
        ((code, said),) = finish([proc], timeout=60)
    assert code == 2, said
    assert "no answer within" not in said, said  # refused by the check's answer, not by waiting out its timeout
    assert re.search(seen(key, testbed), said), said
    port = yaml.safe_load((job.run_folder(None, run_id) / "spec.yaml").read_text())["init"]["master_port"]
    assert f"    try by hand: {check_argv(testbed, job, testbed.names[1], port, ssh_config)}\n" in said, said
    assert "\nnothing was started.\n" in said
    assert not any(job.run_folder(h, run_id).exists() for h in testbed.names)  # no host started its share
    nothing_left(run_id)
    return said


def test_a_host_that_refuses_the_login_is_named_and_nothing_starts(testbed, job, tmp_path):
    config = testbed.ssh_config_refused_by(testbed.names[1], tmp_path)  # host 1 does not know its key
    said = refused(testbed, job, f"d{uuid.uuid4().hex[:8]}", "refused", config)
    assert "hint: is this machine's key in its authorized_keys" in said


@contextlib.contextmanager
def hidden(testbed, host: str, over: str, what: str) -> Iterator[None]:
    """In ``host``'s mount namespace, ``what`` mounted over ``over`` while the block runs: what that host sees."""
    enter = ["nsenter", f"--mount={testbed.mount_ns(host)}", "--"]
    subprocess.run([*enter, "mount", "--bind", what, over], check=True)
    try:
        yield
    finally:
        subprocess.run([*enter, "umount", over], check=True)


def test_a_host_without_run_is_named_and_nothing_starts(testbed, job, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with hidden(testbed, testbed.names[1], str(Path(RUN).parent), str(empty)):  # the venv's bin/ is empty there
        said = refused(testbed, job, f"e{uuid.uuid4().hex[:8]}", "no run")
    assert "hint: install the runner there (the same version), or name it: launcher.ssh.run=" in said


def test_a_host_with_another_torch_is_refused_with_both_versions(testbed, job, tmp_path):
    here = installed()
    other = tmp_path / "run"
    other.write_text(f"#!/bin/sh\necho 'run {here.runner} (torch-jobspec), torch 2.12.0, Python {here.python} (x)'\n")
    other.chmod(0o755)
    with hidden(testbed, testbed.names[1], RUN, str(other)):
        said = refused(testbed, job, f"f{uuid.uuid4().hex[:8]}", "other torch")
    assert "hint: install the same runner and torch on every host" in said


# --------------------------------------------------------------------------- hosts as ssh knows them


def aliases(testbed, folder: Path) -> tuple[str, tuple[str, ...]]:
    """An ssh_config in ``folder`` that knows the bed's hosts only by aliases of its own (``Host <alias>`` /
    ``HostName <address>``, as most users' ~/.ssh/config does), names no resolver knows; the config, and the
    aliases in the hosts' order."""
    lines = Path(testbed.ssh_config).read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("Host "))
    settings = "\n".join(lines[at + 1:])
    names = tuple(f"box{i}-{uuid.uuid4().hex[:6]}" for i in range(len(testbed.hosts)))
    config = folder / "aliases_config"
    config.write_text("".join(f"Host {name}\n  HostName {h.addr}\n{settings}\n"
                              for name, h in zip(names, testbed.hosts)))
    return str(config), names


def shared_job(tmp_path: Path) -> Path:
    """A job folder every host sees as the same folder (outside the bed's home: as an NFS home is shared)."""
    folder = tmp_path / "shared_job"
    folder.mkdir()
    stage_workloads(folder)
    return folder


def test_hosts_known_only_by_ssh_aliases_from_a_hostfile_run_a_2x2_job_in_one_shared_folder(testbed, tmp_path):
    """The hosts as the user's ssh_config knows them (aliases no resolver knows), listed in an Open MPI / DeepSpeed
    hostfile, the job's folder shared by every host: every host dials host 0 at the address ``ssh -G`` gives (said
    in launch.txt and pinned in spec.yaml), the check confirms each reaches it, and the run folder, the same one for
    every host, holds each rank's files once, written by its own host."""
    config, names = aliases(testbed, tmp_path)
    assert all(subprocess.run(["getent", "hosts", n], capture_output=True).returncode == 2 for n in names)
    folder = shared_job(tmp_path)
    (folder / "hosts.txt").write_text(f"# our boxes\n{names[0]} slots=2\n{names[1]} slots=2 max_slots=4\n")
    run_id = f"s{uuid.uuid4().hex[:8]}"
    addr0 = testbed.hosts[0].addr
    argv = [RUN, "launcher=ssh", f"launcher.ssh.config_file={config}", "init=tcp", "topology=hostfile",
            "topology.hostfile=hosts.txt", *digits(2, 64), f"run_id={run_id}"]
    with started(argv, cwd=folder, env=testbed.env(), run_id=run_id, merged=True) as proc:
        ((code, said),) = finish([proc], timeout=200)
    assert code == 0, said
    assert re.search(rf"ssh: 2 host\(s\) ready \(.*\) in \d+\.\d s: {names[0]}, {names[1]}; each reaches host 0's "
                     rf"rendezvous at {re.escape(addr0)} port \d+\n", said), said
    assert "cannot be retrieved (gai error" not in said and "records stay" not in said, said
    run_folder = folder / "outputs" / "runs" / run_id
    launch = (run_folder / "launch.txt").read_text()
    assert re.search(seen("dialled", alias0=names[0], addr0=addr0), launch), launch
    assert f"# host 1 ({names[1]}) is dialled at {testbed.hosts[1].addr}: ssh -G {names[1]}: HostName " \
           f"{testbed.hosts[1].addr} (the name is ssh's alias)\n" in launch
    assert [(h["name"], h["addr"], h["devices"]) for h in yaml.safe_load((run_folder / "spec.yaml").read_text())[
        "topology"]["hosts"]] == [(n, h.addr, 2) for n, h in zip(names, testbed.hosts)]
    done = summary(Job(folder, {None: folder}), None, run_id)
    assert (done["status"], done["world_size"], done["processes_per_host"]) == ("done", 4, [2, 2])
    assert done["final_metrics"]["test_accuracy"] > 0.8
    logs = run_folder / "logs"
    assert sorted(p.name for p in logs.glob("rank*.log")) == [f"rank{r:05d}.log" for r in range(4)]
    for rank, h in enumerate([testbed.hosts[0]] * 2 + [testbed.hosts[1]] * 2):  # each written by its own host
        assert f"({h.addr}) is the interface of the route to the master {addr0}" in (logs / f"rank{rank:05d}.log") \
            .read_text().splitlines()[0]
    assert sorted(p.name for p in logs.glob("rank*.done")) == [f"rank{r:05d}.done" for r in range(4)]
    assert not list(run_folder.rglob("*.tmp"))  # no half-written file of any host
    nothing_left(run_id)


def test_a_master_no_host_resolves_is_refused_by_the_check_in_seconds_naming_each_host(testbed, job, tmp_path):
    """init.master_addr as the alias only this machine's ssh knows: each host's check finds that it does not resolve
    there; `run` exits 2 before any rendezvous is tried (no c10d warning), nothing started anywhere (it was 33 s of
    c10d's warnings, then a share left running on host 0). No bound on the seconds it takes: on a loaded machine
    that is a timing window, and the check's refusal without a word of c10d says what the bound meant."""
    config, names = aliases(testbed, tmp_path)
    run_id = f"u{uuid.uuid4().hex[:8]}"
    hosts = hosts_override(*({"name": n, "devices": 1} for n in names))
    with start(testbed, job, [*hosts, f"init.master_addr={names[0]}"], run_id, ssh_config=config) as proc:
        ((code, said),) = finish([proc], timeout=60)
    assert code == 2, said
    assert re.search(rf"error: launcher=ssh: host 0 \({names[0]}\): host 0's rendezvous: '{names[0]}' does not "
                     rf"resolve on this host \(", said), said
    assert re.search(seen("unresolved", alias0=names[0], alias1=names[1]), said), said
    assert re.search(seen("unresolved hint"), said), said
    assert "\nnothing was started.\n" in said and "c10d" not in said
    assert not any(job.run_folder(h, run_id).exists() for h in testbed.names)
    nothing_left(run_id)


# --------------------------------------------------------------------------- faults


def hang(marker: Path, grace_s: int = 2) -> list[str]:
    """Rank 1 (host 1) falls silent before its 4th all-reduce, writing ``marker`` first; rank 0 waits in it."""
    return ["recipe=custom", "recipe.target=workloads.hang:main", "+recipe.hang_rank=1", "+recipe.hang_step=3",
            f"+recipe.marker={marker}", "recipe.global_batch_size=2", "init.timeout_s=300", f"launcher.grace_s={grace_s}"]


def job_processes(testbed, host: str, run_id: str) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """On ``host``: the sshd processes of the job's ssh login (between the host's sshd daemon and the job's `run`),
    and the job's `run` and ranks (command lines naming ``run_id``, and what they started). Only what the job's
    login started: the bed is shared, and the host's slurmd, its sshd daemon and other tests' logins are not these."""
    daemon = psutil.Process(int(testbed.ssh["hosts"][host]["sshd_pid"]))
    logins: dict[int, psutil.Process] = {}
    job: dict[int, psutil.Process] = {}
    for p in daemon.children(recursive=True):
        try:
            if any(run_id in word for word in p.cmdline()):
                job.update({q.pid: q for q in (p, *p.children(recursive=True))})
                logins.update({q.pid: q for q in p.parents() if q.pid != daemon.pid and daemon in q.parents()})
        except psutil.Error:
            continue
    return [p for pid, p in logins.items() if pid not in job], list(job.values())


def kill_host(testbed, host: str, run_id: str) -> int:
    """The job's processes on ``host`` killed at once (its ssh login, its `run`, its ranks): the machine gone, as its
    peers see it. How many."""
    return kill_hosts(testbed, [host], run_id)


def kill_hosts(testbed, hosts: list[str], run_id: str) -> int:
    """:func:`kill_host` for several hosts together, as one event: every one's processes found, then all frozen
    (SIGSTOP), then all killed. Killing one host's makes the launch stop the others' at once: found but still
    running, they could end their attempt and be started again before the kill reached them. How many."""
    found = [p for logins, job in (job_processes(testbed, host, run_id) for host in hosts) for p in (*logins, *job)]
    for act in (psutil.Process.suspend, psutil.Process.kill):
        for p in found:
            try:
                act(p)
            except psutil.Error:
                continue
    return len(found)


def test_a_host_killed_mid_run_ends_the_job_on_every_host_within_seconds(testbed, job, tmp_path):
    run_id = f"g{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "rank1.stuck"  # outside the bed's home: every host writes the same folder here
    with start(testbed, job, [*bed_hosts(testbed, [1, 1]), *hang(marker)], run_id) as proc:
        wait_until(marker.exists, 120, "rank 1 stuck", alive=[proc])
        assert kill_host(testbed, testbed.names[1], run_id) >= 3  # its login, its `run` and its rank, at least
        ((code, said),) = finish([proc], timeout=60)  # host 0's rank waits in an all-reduce: the driver ends it,
    assert code == 1, said  # not the collective's timeout (init.timeout_s=300)
    for key in ("lost", "lost on host 0", "lost status"):
        assert re.search(seen(key, testbed), said), (key, said)
    assert summary(job, None, run_id)["first_failure"]["exception"].startswith(f"host 1 ({testbed.names[1]}) was lost")
    nothing_left(run_id)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_to_run_reaches_every_rank_on_every_host(testbed, job, tmp_path, signum):
    """Ctrl-C stops every rank at once; SIGTERM asks them to checkpoint and stop, and launcher.grace_s=2 later kills
    what still runs (rank 1 sleeps, rank 0 waits for it), host 0 saying where every rank was. Exit 128 + n."""
    run_id = f"h{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "rank1.stuck"
    with start(testbed, job, [*bed_hosts(testbed, [1, 1]), *hang(marker, grace_s=60 if signum == signal.SIGINT
                                                                   else 2)], run_id) as proc:
        wait_until(marker.exists, 120, "rank 1 stuck", alive=[proc])
        proc.send_signal(signum)
        asked = time.monotonic()
        ((code, said),) = finish([proc], timeout=60)
    assert code == 128 + signum, said
    if signum == signal.SIGINT:
        assert time.monotonic() - asked < 30, said  # at once, not after launcher.grace_s=60
        assert re.search(seen("sigint", testbed), said), said
        assert f"[host {testbed.names[0]}] SIGINT: stopping 1 process(es)" in said
    else:
        for host in testbed.names:
            assert f"[host {host}] SIGTERM: asking 1 process(es) to checkpoint and stop" in said, said
        assert re.search(rf"\[host {testbed.names[0]}\] SIGTERM: rank\(s\) 0 still running launcher.grace_s=2 s after "
                         rf"it; killing them: rank 0 waits in all_reduce #4", said), said
    assert f"status    stopped by {signal.Signals(signum).name} (exit {128 + signum})" in said
    nothing_left(run_id)


def test_ctrl_backslash_says_where_every_rank_of_every_host_is_and_the_job_goes_on(testbed, job, tmp_path):
    """Ctrl-\\ to `run`, whose hosts share no folder with it: host 0's agent asks every rank through the job's
    channel and says, on this terminal, where each one is whatever its host; the job goes on (SIGTERM ends it)."""
    run_id = f"q{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "rank1.stuck"
    with start(testbed, job, [*bed_hosts(testbed, [1, 1]), *hang(marker)], run_id) as proc:
        wait_until(marker.exists, 120, "rank 1 stuck", alive=[proc])
        proc.send_signal(signal.SIGQUIT)
        wait_until(lambda: proc.said(QUIT_SAID + "the job goes on)"), 30, "told where the ranks are", alive=[proc])
        assert proc.proc.poll() is None  # the job goes on
        proc.send_signal(signal.SIGTERM)
        ((code, said),) = finish([proc], timeout=60)
    host_0 = re.escape(f"[host {testbed.names[0]}] ")
    assert re.search(host_0 + r"where the ranks are: rank 0 waits in all_reduce #4 .*; rank 1 never entered it: .* "
                     r"at workloads/hang\.py:\d+ in main", said), said
    assert said.count("where the ranks are: ") == 1, said  # host 0 alone answers; this `run` does not
    assert code == 128 + signal.SIGTERM, said
    nothing_left(run_id)


def test_the_stop_signal_makes_every_rank_checkpoint_and_return(testbed, job):
    """kill -USR1 <run>: the digits recipe on both hosts agrees to stop, checkpoints and returns: exit 0."""
    run_id = f"l{uuid.uuid4().hex[:8]}"
    with start(testbed, job, [*bed_hosts(testbed, [1, 1]), *digits(20, 64)], run_id) as proc:
        log = job.run_folder(testbed.names[1], run_id) / "logs" / "rank00001.log"
        wait_until(lambda: log.exists() and "progress: train step" in log.read_text(), 120, "rank 1 training",
                   alive=[proc])
        proc.send_signal(signal.SIGUSR1)
        ((code, said),) = finish([proc], timeout=120)
    assert code == 0, said
    for host in testbed.names:
        assert f"[host {host}] SIGUSR1: asking 1 process(es) to checkpoint and stop" in said, said
    assert "status    stopped on request" in said, said
    assert (job.run_folder(testbed.names[0], run_id) / "checkpoints" / "last.pt").exists()
    nothing_left(run_id)


def test_a_host_whose_login_stops_answering_is_lost_after_its_keepalives_and_stops_by_itself(testbed, job, tmp_path):
    """Host 1's end of the ssh connection frozen (SIGSTOP to its sshd session: as a machine cut off the network, no
    connection closes and nothing answers), so ssh's keepalives tell this `run` (launcher.ssh.keepalive_s=1: lost
    after 3 s), which ends the job on host 0; host 1's `run`, which hears no beat, stops its share by itself:
    nothing is left there either. (Not the host's link taken down: the bed is shared, and its slurmd is on it.)"""
    run_id = f"m{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "rank1.stuck"
    frozen: list[psutil.Process] = []
    try:
        with start(testbed, job, [*bed_hosts(testbed, [1, 1]), *hang(marker), "launcher.ssh.keepalive_s=1"],
                   run_id) as proc:
            wait_until(marker.exists, 120, "rank 1 stuck", alive=[proc])
            frozen, _ = job_processes(testbed, testbed.names[1], run_id)
            assert frozen, "no ssh login of the job on host 1"
            for p in frozen:
                p.suspend()
            ((code, said),) = finish([proc], timeout=60)
        assert code == 1, said
        host1 = re.escape(testbed.names[1])
        assert re.search(rf"ssh: host 1 \({host1}\) lost: ssh exited 255 \(Timeout, server {host1} not responding\.\)",
                         said), said
        wait_until(lambda: not processes_of(run_id), 40, "host 1's share stopped by itself")
    finally:
        for p in frozen:
            try:
                p.kill()  # its client is gone: nothing to resume
            except psutil.Error:
                pass


def test_a_host_that_refuses_its_share_ends_the_job_and_nothing_is_left_on_any_host(testbed, job):
    """Host 1's `run` refuses the spec (the script is not in its job folder) while host 0's share has started and
    waits for it: the job ends on host 0 at once, `run` exits 2, and within launcher.grace_s + a few seconds no
    process of the job is left on any host."""
    run_id = f"v{uuid.uuid4().hex[:8]}"
    for view in (job.views[None], job.views[testbed.names[0]]):
        shutil.copy(REPO / "benchmarks" / "workloads" / "tiny_ddp.py", view / "only_here.py")
    with start(testbed, job, [*bed_hosts(testbed, [2, 2]), "launcher.grace_s=2", "--", "only_here.py"],
               run_id) as proc:
        ((code, said),) = finish([proc], timeout=60)
    assert code == 2, said
    assert re.search(rf"\[host {testbed.names[1]}\] error: recipe.path: ", said), said
    assert f"[host {testbed.names[0]}] host {testbed.names[1]}: its `run` ended with exit 2" in said, said
    wait_until(lambda: not processes_of(run_id), 2 + 10, "nothing left of the run on any host")  # its deadline: the bound


def test_a_dropped_ssh_connection_ends_the_job_and_nothing_is_left_on_any_host(testbed, job, tmp_path):
    """Host 1's ssh client killed on this machine (the connection dropped) while rank 0 waits in an all-reduce: the
    job ends with host 1 named (exit 1); host 1's `run` sees its stdin end and stops its share; nothing is left."""
    run_id = f"w{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "rank1.stuck"
    with start(testbed, job, [*bed_hosts(testbed, [1, 1]), *hang(marker)], run_id) as proc:
        wait_until(marker.exists, 120, "rank 1 stuck", alive=[proc])
        clients = [p for p in psutil.Process(proc.pid).children() if p.name() == "ssh"
                   and "--ssh-host 1 " in p.cmdline()[-1]]
        assert len(clients) == 1, [p.cmdline() for p in clients]
        clients[0].kill()
        ((code, said),) = finish([proc], timeout=60)
    assert code == 1, said
    assert f"ssh: host 1 ({testbed.names[1]}) lost: ssh was killed by SIGKILL" in said, said
    wait_until(lambda: not processes_of(run_id), 2 + 15, "nothing left of the run on any host")


def host_run(run_id: str, node: int) -> psutil.Process | None:
    """Host ``node``'s `run --ssh-host` of the run (not the ssh client that started it)."""
    for p in processes_of(run_id):
        try:
            cmdline = p.cmdline()
            if p.name() != "ssh" and "--ssh-host" in cmdline and cmdline[cmdline.index("--ssh-host") + 1] == str(node):
                return p
        except psutil.Error:
            continue
    return None


def test_run_killed_while_a_host_waits_for_host_0_leaves_nothing_on_any_host(testbed, job):
    """Host 0's `run` frozen as it starts (a slow host), so host 1's waits for host 0's store; `run` killed with
    SIGKILL: the ssh clients die with it, host 1's `run` sees its stdin end and stops waiting at once; host 0's, once
    it runs again, ends by itself. Nothing of the job is left on any host."""
    run_id = f"x{uuid.uuid4().hex[:8]}"
    with start(testbed, job, [*bed_hosts(testbed, [1, 1]), "launcher.grace_s=2", *digits(50, 64)], run_id) as proc:
        wait_until(lambda: host_run(run_id, 0) is not None, 60, "host 0's run started", alive=[proc])
        host0 = host_run(run_id, 0)
        host0.suspend()
        try:
            wait_until(lambda: host_run(run_id, 1) is not None, 60, "host 1's run started", alive=[proc])
            proc.reap()  # SIGKILL to `run`
            frozen = {host0.pid, *(c.pid for c in host0.children(recursive=True))}  # (its zygote, if it got so far)
            wait_until(lambda: {p.pid for p in processes_of(run_id)} <= frozen, 2 + 10,
                       "nothing left of the run but host 0's frozen `run`")  # (its deadline: the bound)
        finally:
            host0.resume()
    wait_until(lambda: not processes_of(run_id), 2 + 15 + 5, "nothing left of the run on any host")


def test_nothing_outlives_run_when_it_is_killed(testbed, job, tmp_path):
    """SIGKILL to `run` itself: it can pass nothing on, but each host's ssh session ends with it (the ssh clients'
    stdin closes), so each host's `run` sees its stdin end and stops its ranks as on SIGTERM: nothing is left on any
    host after launcher.grace_s."""
    run_id = f"i{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "rank1.stuck"
    with start(testbed, job, [*bed_hosts(testbed, [1, 1]), *hang(marker)], run_id) as proc:
        wait_until(marker.exists, 120, "rank 1 stuck", alive=[proc])
        hosts = {c[c.index("--ssh-host") + 1] for p in processes_of(run_id) if "--ssh-host" in (c := p.cmdline())}
        assert hosts == {"0", "1"}  # both hosts' `run`s (and their ranks, forked from them)
        proc.reap()
    wait_until(lambda: not processes_of(run_id), 30, "nothing left of the run on any host")


def test_a_restart_resumes_every_host_to_the_weights_of_an_uninterrupted_run(testbed, job, tmp_path):
    """workloads/flaky.py (40 steps, a checkpoint every 4) with launcher.max_restarts=1; rank 1 (host 1) killed at
    step 10: both hosts restart together and resume from host 0's checkpoint, and the final weights equal those of the
    same job uninterrupted, bit for bit."""
    def flaky(out: Path) -> list[str]:
        out.mkdir()
        return [*bed_hosts(testbed, [1, 1]), "recipe=custom", "recipe.target=workloads.flaky:main",
                f"+recipe.out_dir={out}", "+recipe.steps=40", "+recipe.every=4", "+recipe.fail_rank=-1",
                "+recipe.fail_step=0", "+recipe.fail_attempts=0", "+recipe.step_s=0.1", "recipe.global_batch_size=2",
                "launcher.max_restarts=1"]

    straight = tmp_path / "straight"
    with start(testbed, job, flaky(straight), f"j{uuid.uuid4().hex[:8]}") as proc:
        ((code, said),) = finish([proc], timeout=200)
    assert code == 0, said
    run_id, out = f"k{uuid.uuid4().hex[:8]}", tmp_path / "killed"
    with start(testbed, job, flaky(out), run_id) as proc:
        wait_until(lambda: (out / "step").exists() and int((out / "step").read_text() or 0) >= 10, 120, "step 10",
                   alive=[proc])
        os.kill(int((out / "pid1.0").read_text()), signal.SIGKILL)
        ((code, said),) = finish([proc], timeout=200)
    assert code == 0, said
    for host in testbed.names:
        assert f"[host {host}] restarting: attempt 2 of 2 (launcher.max_restarts=1)" in said, said
    first = json.loads((out / "attempt1.json").read_text())["first_step"]
    assert 8 <= first <= 16 and first % 4 == 0, first
    a, b = torch.load(straight / "final.pt"), torch.load(out / "final.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    nothing_left(run_id)


@pytest.mark.docs
def test_the_readme_quotes_what_these_tests_see():
    """docs/ssh.md shows real output of these tests: each quoted line is one they assert."""
    check_readme_quotes("A job over ssh", SAID, "tests/e2e/test_ssh.py")
