"""A lost host, survived or not: torchrun's elastic rendezvous (``--nnodes=2:3 --rdzv-backend=c10d``) against `run
launcher=ssh topology.min_nodes=2` and `run launcher=manual topology.min_nodes=2`, on three network-namespace hosts of
the test bed, for three faults.

    .venv/bin/python benchmarks/lost_hosts.py [--rounds 1]

Needs root and what scripts/testbed.py needs: it brings up a bed of its own (``testbed.py up --hosts 3 --sshd``) and
takes it down at the end, also when a trial fails. Both launchers run the same torchrun-style script
(benchmarks/workloads/elastic_steps.py: a tiny DDP model, one all-reduce a step, 0.1 s a step, 60 steps, a
checkpoint every 5 steps into a folder every host sees, resumed from), one process per host, three restarts allowed:

* torchrun: ``torchrun --nnodes=2:3 --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=HOST0:PORT --rdzv-id=ID
  --max-restarts=3 --rdzv-conf=is_host=1|0,last_call_timeout=1 --local-addr=ADDR`` in each host's namespace, with
  GLOO_SOCKET_IFNAME=lan0 (``last_call_timeout=1``: a re-formed rendezvous of two hosts waits 1 s for a third, not its
  default 30 s; ``is_host`` and ``--local-addr``: what torchrun needs where host names resolve to 127.0.0.1);
* run: ``run launcher=ssh topology.hosts=[the three hosts] topology.min_nodes=2 launcher.max_restarts=3
  launcher.ssh.keepalive_s=1 init=tcp -- elastic_steps.py ...`` from the root namespace (a machine that is none of
  the hosts), each host logged in to over its own sshd;
* run by hand: ``run launcher=manual ... launcher.manual.host=i -- elastic_steps.py ...`` in each host's namespace,
  each in a folder of its own (the script's steps and checkpoints in the folder every host sees), its default
  ``launcher.manual.keepalive_s=2``. The host cut off ends by itself (exit 1, by design): its exit is not counted
  against the job's finishing, as torchrun's on a killed host is not.

The faults, once rank 0 did step 15: **kill** (every process of host 2's job killed: the machine gone), **link**
(host 2's link taken down: its packets dropped, no connection closed; back up once the trial is over), **host 0**
(every process of host 0's job killed: the host that serves torchrun's c10d store, and run's first attempt's).
Per trial: whether the job finished (every launcher still running exited 0 and rank 0 did the last step), the seconds
from the fault to the next attempt's first step (rank 0's first line with another TORCHELASTIC_RESTART_COUNT or world
size), the world size it finished at, and how many processes of the job were still in the namespaces 30 s after the
trial (a launcher that had not ended by TRIAL_S is killed first; a host cut off stops its share by itself once it
misses the launching `run`'s beats: the seconds it took). Every trial counts, nothing is retried; which launcher goes
first alternates. Results: benchmarks/results/lost_hosts.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import IO

import result_file
from namespace_bed import Bed

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "workloads" / "elastic_steps.py"
BIN = Path(sys.executable).parent
TORCHRUN, RUN = "torchrun --nnodes=2:3 (c10d)", "run launcher=ssh topology.min_nodes=2"
MANUAL = "run launcher=manual topology.min_nodes=2"
LAUNCHERS = (TORCHRUN, RUN, MANUAL)
PER_HOST = (TORCHRUN, MANUAL)  # a launcher process in each host's namespace (the lost host's is not counted)
FAULTS = ("kill", "link", "host 0")
STEPS, EVERY, STEP_S, FAULT_AT = 60, 5, 0.1, 15
START_S, TRIAL_S = 120.0, 180.0  # deadlines: the fault point, and the whole trial after the fault
POLL_S = 0.05
LEFT_WAIT_S = 30.0  # after a trial: how long the job's processes get to end by themselves before they are counted
_FOREIGN_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_")


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _job_left(bed: Bed) -> dict[int, str]:
    """The job's processes still in the namespaces (not an sshd's), with their command lines."""
    found = {pid: _cmdline(pid)[:80] for pid in bed.pids()}
    return {pid: c for pid, c in found.items() if c and not c.startswith("sshd")}


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _steps(out: Path) -> list[dict]:
    try:
        lines = (out / "steps.jsonl").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        try:
            found.append(json.loads(line))
        except ValueError:
            continue  # being written
    return found


def _start(bed: Bed, launcher: str, folder: Path, out: Path, ckpt: Path) -> list[subprocess.Popen]:
    """The launcher's processes: torchrun in each host's namespace, or one `run` here."""
    script = ["--out", str(out), "--ckpt", str(ckpt), "--steps", str(STEPS), "--every", str(EVERY),
              "--step-s", str(STEP_S)]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_FOREIGN_PREFIXES) and k not in ("PYTHONPATH", "OMP_NUM_THREADS")}
    log = (folder / "output.txt").open("w")
    if launcher == TORCHRUN:
        endpoint = f"{bed.hosts[0]['addr']}:{bed.free_port(0)}"
        job_id = f"lb{uuid.uuid4().hex[:10]}"
        procs = []
        for i, h in enumerate(bed.hosts):
            argv = [str(BIN / "torchrun"), "--nnodes=2:3", "--nproc-per-node=1", "--rdzv-backend=c10d",
                    f"--rdzv-endpoint={endpoint}", f"--rdzv-id={job_id}", "--max-restarts=3",
                    f"--rdzv-conf=is_host={int(i == 0)},last_call_timeout=1", f"--local-addr={h['addr']}",
                    str(folder / SCRIPT.name), *script]
            procs.append(subprocess.Popen(bed.exec_argv(i, argv), cwd=folder, env={**env, "GLOO_SOCKET_IFNAME": "lan0"},
                                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        return procs
    hosts = ", ".join(f"{{name: '{h['name']}', devices: 1}}" for h in bed.hosts)
    if launcher == MANUAL:
        return _start_by_hand(bed, folder, hosts, script, env, log)
    job = Path(bed.ssh["home"]) / folder.name  # the job's folder: the same path in every host's view
    for view in (Path(bed.ssh["home"]), *(Path(v["home"]) for v in bed.ssh["hosts"].values())):
        (view / folder.name).mkdir(exist_ok=True)
        (view / folder.name / SCRIPT.name).write_text(SCRIPT.read_text())
    argv = [str(BIN / "run"), "launcher=ssh", f"launcher.ssh.config_file={bed.ssh['config']}", "init=tcp",
            "topology=custom", f"topology.hosts=[{hosts}]", "topology.min_nodes=2", "launcher.max_restarts=3",
            "launcher.ssh.keepalive_s=1", "launcher.grace_s=2", f"run_id=lb{uuid.uuid4().hex[:10]}", "--",
            SCRIPT.name, *script]
    return [subprocess.Popen(argv, cwd=job, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)]


def _start_by_hand(bed: Bed, folder: Path, hosts: str, script: list[str], env: dict[str, str],
                   log: IO[str]) -> list[subprocess.Popen]:
    """launcher=manual: each host's `run` in its namespace, in a folder of its own (``folder/host<i>``)."""
    run_id, procs = f"lm{uuid.uuid4().hex[:10]}", []
    for i in range(len(bed.hosts)):
        own = folder / f"host{i}"
        own.mkdir()
        (own / SCRIPT.name).write_text(SCRIPT.read_text())
        argv = [str(BIN / "run"), "launcher=manual", "init=tcp", "topology=custom", f"topology.hosts=[{hosts}]",
                "topology.min_nodes=2", "launcher.max_restarts=3", "launcher.grace_s=2", f"launcher.manual.host={i}",
                f"run_id={run_id}", "--", SCRIPT.name, *script]
        procs.append(subprocess.Popen(bed.exec_argv(i, argv), cwd=own, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))
    return procs


def trial(bed: Bed, launcher: str, fault: str, folder: Path) -> dict:
    """One job under ``launcher``: the fault once rank 0 did step FAULT_AT, then its end."""
    out, ckpt = folder / "steps", folder / "ckpt"
    for d in (out, ckpt):
        d.mkdir(parents=True)
    (folder / SCRIPT.name).write_text(SCRIPT.read_text())
    procs = _start(bed, launcher, folder, out, ckpt)
    result: dict = {"launcher": launcher, "fault": fault}
    victim = 0 if fault == "host 0" else 2
    try:
        deadline = time.monotonic() + START_S
        while not any(s["step"] >= FAULT_AT for s in _steps(out)):
            if time.monotonic() > deadline or all(p.poll() is not None for p in procs):
                raise RuntimeError(f"rank 0 not at step {FAULT_AT} within {START_S:g} s")
            time.sleep(POLL_S)
        before = _steps(out)[-1]
        faulted = time.time()
        if fault == "link":
            bed.link(victim, up=False)
        else:
            _kill(bed.pids(victim))
        # a per-host launcher's process on the lost host dies with its namespace's processes (or, cut off, ends by
        # itself); the others must end by themselves
        running = [p for i, p in enumerate(procs) if not (launcher in PER_HOST and i == victim)]
        end = time.monotonic() + TRIAL_S
        while any(p.poll() is None for p in running) and time.monotonic() < end:
            time.sleep(POLL_S)
        after = [s for s in _steps(out) if s["t"] > faulted and (s["attempt"], s["world"]) !=
                 (before["attempt"], before["world"])]
        steps = _steps(out)
        result.update(
            recovered_s=round(after[0]["t"] - faulted, 2) if after else None,
            finished=all(p.poll() == 0 for p in running) and bool(steps) and steps[-1]["step"] == STEPS,
            exit_codes=[p.poll() for p in running], world_after=after[-1]["world"] if after else None,
            resumed_from=after[0]["resumed"] if after else None, step_at_fault=before["step"])
    except RuntimeError as e:
        result["error"] = str(e)
    finally:
        bed.link(victim, up=True)
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        # what the job left in the namespaces, given LEFT_WAIT_S to end by itself (a host cut off stops its share once
        # it misses the launching `run`'s beats; an sshd's session of a login whose client is gone is the sshd's,
        # closed by its own keepalives: listed, not counted)
        waited = time.monotonic()
        while (left := _job_left(bed)) and time.monotonic() - waited < LEFT_WAIT_S:
            time.sleep(POLL_S)
        result["left_running"] = len(left)
        result["ended_by_itself_s"] = None if left else round(time.monotonic() - waited, 1)
        result["left"] = sorted(set(left.values()))
        _kill(bed.pids())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=1, help="trials of each launcher and fault")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("the namespace test bed needs root (scripts/testbed.py)")
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, lambda signum, _: sys.exit(128 + signum))
    trials: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="lb-") as tmp:
        bed = Bed(Path(tmp) / "bed", hosts=3, prefix="lb", sshd=True)
        try:
            for r in range(args.rounds):
                for k, fault in enumerate(FAULTS):
                    for j in range(len(LAUNCHERS)):
                        launcher = LAUNCHERS[(r + k + j) % len(LAUNCHERS)]
                        folder = Path(tmp) / f"t{r}{k}{j}"
                        folder.mkdir()
                        t = trial(bed, launcher, fault, folder)
                        trials.append(t)
                        print(f"{fault}, {launcher}: " + json.dumps({k: v for k, v in t.items()
                                                                    if k not in ("launcher", "fault")}), flush=True)
        finally:
            bed.close()
    table: dict = {}
    for fault in FAULTS:
        row = {}
        for launcher in LAUNCHERS:
            ts = [t for t in trials if t["fault"] == fault and t["launcher"] == launcher]
            times = [t["recovered_s"] for t in ts if t.get("finished") and t.get("recovered_s") is not None]
            row[launcher] = {"finished": sum(1 for t in ts if t.get("finished")), "trials": len(ts),
                             "median_recovered_s": statistics.median(times) if times else None}
        b = row[TORCHRUN]["median_recovered_s"]
        for ours, key in ((RUN, "ratio_run_vs_torchrun"), (MANUAL, "ratio_manual_vs_torchrun")):
            a = row[ours]["median_recovered_s"]
            row[key] = round(a / b, 2) if a and b else None
        table[fault] = row
    out = result_file.write("lost_hosts", rounds=args.rounds, steps=STEPS, step_s=STEP_S, fault_at_step=FAULT_AT,
                            results=table, trials=trials)
    for fault, row in table.items():
        cells = "; ".join(f"{name}: finished {r['finished']} of {r['trials']}, next attempt's first step "
                          f"{'n/a' if r['median_recovered_s'] is None else format(r['median_recovered_s'], '.1f') + ' s'}"
                          f" after the fault" for name, r in row.items() if name in LAUNCHERS)
        ratios = [f"{name} / torchrun {row[key]}x" for name, key in (("ssh", "ratio_run_vs_torchrun"),
                                                                     ("manual", "ratio_manual_vs_torchrun")) if row[key]]
        print(f"{fault}: {cells}" + "".join(f"; {r}" for r in ratios))
    print(f"written: {out}")


if __name__ == "__main__":
    main()
