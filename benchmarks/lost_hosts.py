"""A lost host, survived or not: torchrun's elastic rendezvous (``--nnodes=2:3 --rdzv-backend=c10d``) against `run
launcher=ssh topology.min_nodes=2` and `run launcher=manual topology.min_nodes=2`, on three network-namespace hosts of
the test bed, for three faults, a host that comes back, and a third host that starts late.

    .venv/bin/python benchmarks/lost_hosts.py [--rounds 1] [--faults kill link "host 0" back late]

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
(every process of host 0's job killed: the host that serves torchrun's c10d store, and run's first attempt's);
**back** (a job of 200 steps: host 2 lost at step 15, and back once the two others did step 30; under torchrun its
processes killed, its agent started again at its return, as a machine that comes back would start it; under `run`
over ssh its link down and its processes killed, its link up at its return, nothing started: `run` tries the lost
host every ``launcher.ssh.rejoin_s=1``; under `run` by hand the same, and its `run` typed again at its return, as
torchrun's agent is): the seconds from the return to the first step of the grown world, and the steps lost (since
the checkpoint it resumed from); **late** (a job of 200 steps started on hosts 0 and 1, host 2 started once rank 0
did step 15: under torchrun its agent, ``--nnodes=2:3``; under `run` the spec's hosts are 0 and 1, host 2 a spare
(``topology.spares``, ``topology.max_nodes=3``), over ssh its link down until then (the launch finds it not ready,
and tries it every ``launcher.ssh.rejoin_s=1``), by hand its `run` typed then): the seconds from its start to the
first step at world size 3, and the steps lost.
Per trial: whether the job finished (every launcher still running exited 0 and rank 0 did the last step), the seconds
from the fault to the next attempt's first step (rank 0's first line with another TORCHELASTIC_RESTART_COUNT or world
size), the world size it finished at, and how many processes of the job were still in the namespaces 30 s after the
trial (a launcher that had not ended by TRIAL_S is killed first; a host cut off stops its share by itself once it
misses the launching `run`'s beats: the seconds it took). Every trial counts, nothing is retried; which launcher goes
first alternates. Results: benchmarks/results/lost_hosts.json (with ``--faults``, the other faults' results are kept).
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
FAULTS = ("kill", "link", "host 0", "back", "late")
GROWING = ("back", "late")  # the faults after which the job grows again
GROWS = (TORCHRUN, RUN, MANUAL)  # the launchers that take a host back
STEPS, EVERY, STEP_S, FAULT_AT = 60, 5, 0.1, 15
BACK_STEPS, BACK_AT = 200, 30  # "back": a longer job, host 2 back once rank 0 of the two did step 30
LATE_AT = 15  # "late": host 2 started once rank 0 of the first two did this step (of BACK_STEPS)
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


def _start(bed: Bed, launcher: str, folder: Path, out: Path, ckpt: Path, steps: int = STEPS,
           again: list | None = None, late: bool = False) -> list[subprocess.Popen]:
    """The launcher's processes: torchrun in each host's namespace, or one `run` here. ``again``: given a list, it gets
    a function that starts host i's torchrun again (a host that comes back). ``late``: host 2 is not started (under
    `run`, a spare: over ssh, the launch tries it until it answers)."""
    script = ["--out", str(out), "--ckpt", str(ckpt), "--steps", str(steps), "--every", str(EVERY),
              "--step-s", str(STEP_S)]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_FOREIGN_PREFIXES) and k not in ("PYTHONPATH", "OMP_NUM_THREADS")}
    log = (folder / "output.txt").open("w")
    if launcher == TORCHRUN:
        endpoint = f"{bed.hosts[0]['addr']}:{bed.free_port(0)}"
        job_id = f"lb{uuid.uuid4().hex[:10]}"

        def agent(i: int) -> subprocess.Popen:
            argv = [str(BIN / "torchrun"), "--nnodes=2:3", "--nproc-per-node=1", "--rdzv-backend=c10d",
                    f"--rdzv-endpoint={endpoint}", f"--rdzv-id={job_id}", "--max-restarts=3",
                    f"--rdzv-conf=is_host={int(i == 0)},last_call_timeout=1", f"--local-addr={bed.hosts[i]['addr']}",
                    str(folder / SCRIPT.name), *script]
            return subprocess.Popen(bed.exec_argv(i, argv), cwd=folder, env={**env, "GLOO_SOCKET_IFNAME": "lan0"},
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

        if again is not None:
            again.append(agent)
        return [agent(i) for i in range(2 if late else len(bed.hosts))]
    named = [f"{{name: '{h['name']}', devices: 1}}" for h in bed.hosts]
    topology = [f"topology.hosts=[{', '.join(named[:2])}]", f"topology.spares=[{named[2]}]", "topology.max_nodes=3"] \
        if late else [f"topology.hosts=[{', '.join(named)}]"]
    if launcher == MANUAL:
        return _start_by_hand(bed, folder, topology, script, env, log, again, late)
    job = Path(bed.ssh["home"]) / folder.name  # the job's folder: the same path in every host's view
    for view in (Path(bed.ssh["home"]), *(Path(v["home"]) for v in bed.ssh["hosts"].values())):
        (view / folder.name).mkdir(exist_ok=True)
        (view / folder.name / SCRIPT.name).write_text(SCRIPT.read_text())
    argv = [str(BIN / "run"), "launcher=ssh", f"launcher.ssh.config_file={bed.ssh['config']}", "init=tcp",
            "topology=custom", *topology, "topology.min_nodes=2", "launcher.max_restarts=3",
            "launcher.ssh.keepalive_s=1", f"launcher.ssh.rejoin_s={1 if steps == BACK_STEPS else 0}",
            "launcher.grace_s=2", *(["launcher.ssh.connect_timeout_s=2"] if late else []),
            f"run_id=lb{uuid.uuid4().hex[:10]}", "--",
            SCRIPT.name, *script]
    return [subprocess.Popen(argv, cwd=job, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)]


def _start_by_hand(bed: Bed, folder: Path, topology: list[str], script: list[str], env: dict[str, str],
                   log: IO[str], again: list | None = None, late: bool = False) -> list[subprocess.Popen]:
    """launcher=manual: each host's `run` in its namespace, in a folder of its own (``folder/host<i>``). ``again``:
    given a list, it gets a function that types host i's command again (a host that comes back). ``late``: host 2's
    is not typed (a spare, typed later)."""
    run_id = f"lm{uuid.uuid4().hex[:10]}"
    for i in range(len(bed.hosts)):
        own = folder / f"host{i}"
        own.mkdir()
        (own / SCRIPT.name).write_text(SCRIPT.read_text())

    def typed(i: int) -> subprocess.Popen:
        argv = [str(BIN / "run"), "launcher=manual", "init=tcp", "topology=custom", *topology,
                "topology.min_nodes=2", "launcher.max_restarts=3", "launcher.grace_s=2", f"launcher.manual.host={i}",
                f"run_id={run_id}", "--", SCRIPT.name, *script]
        return subprocess.Popen(bed.exec_argv(i, argv), cwd=folder / f"host{i}", env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)

    if again is not None:
        again.append(typed)
    return [typed(i) for i in range(2 if late else len(bed.hosts))]


def trial(bed: Bed, launcher: str, fault: str, folder: Path) -> dict:
    """One job under ``launcher``: the fault once rank 0 did step FAULT_AT, then its end."""
    out, ckpt = folder / "steps", folder / "ckpt"
    for d in (out, ckpt):
        d.mkdir(parents=True)
    (folder / SCRIPT.name).write_text(SCRIPT.read_text())
    again: list = []
    steps = BACK_STEPS if fault in GROWING else STEPS
    if fault == "late" and launcher == RUN:
        bed.link(2, up=False)  # (the machine not up yet: the launch finds it not ready)
    procs = _start(bed, launcher, folder, out, ckpt, steps, again, late=fault == "late")
    result: dict = {"launcher": launcher, "fault": fault}
    victim = 0 if fault == "host 0" else 2
    if fault == "back":
        return _back(bed, launcher, procs, again, out, result)
    if fault == "late":
        return _late(bed, launcher, procs, again, out, result)
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
        _clean_up(bed, victim, procs, result)
    return result


def _wait_for_step(out: Path, procs: list[subprocess.Popen], step: int, world: int | None = None) -> None:
    deadline = time.monotonic() + START_S
    while not any(s["step"] >= step and world in (None, s["world"]) for s in _steps(out)):
        if time.monotonic() > deadline or all(p.poll() is not None for p in procs):
            raise RuntimeError(f"rank 0 not at step {step}{'' if world is None else f' of world {world}'} within "
                               f"{START_S:g} s")
        time.sleep(POLL_S)


def _back(bed: Bed, launcher: str, procs: list[subprocess.Popen], again: list, out: Path, result: dict) -> dict:
    """Host 2 lost once rank 0 did step FAULT_AT, back once the two others did step BACK_AT: under torchrun its job's
    processes killed (the survivors see their connections close: torchrun survives no silent host), its agent
    started again at its return, as a machine that comes back would start it; under `run` its link down and its
    processes killed, its link up at its return (nothing started: the launching `run` tries it; by hand, its `run`
    typed again). The seconds from its return to the first step of the grown world, and the steps lost (since the
    checkpoint that resumed)."""
    try:
        _wait_for_step(out, procs, FAULT_AT)
        if launcher != TORCHRUN:
            bed.link(2, up=False)  # the machine silent: `run` must not find it until it is back
        _kill(bed.pids(2))  # (torchrun: with its link up, the survivors' connections to it close)
        _wait_for_step(out, procs, BACK_AT, world=2)
        back = time.time()
        bed.link(2, up=True)
        if launcher in PER_HOST:
            procs[2] = again[0](2)
        running = [p for i, p in enumerate(procs) if not (launcher in PER_HOST and i == 2 and p.poll() is not None)]
        return _grown(running, out, back, result)
    except RuntimeError as e:
        result["error"] = str(e)
    finally:
        _clean_up(bed, 2, procs, result)
    return result


def _late(bed: Bed, launcher: str, procs: list[subprocess.Popen], again: list, out: Path, result: dict) -> dict:
    """Host 2 started once rank 0 of hosts 0 and 1 did step LATE_AT: torchrun's agent started there, or `run` by
    hand typed there (a spare), or, over ssh, its link up (the launch tries it every second). The seconds from its
    start to the first step at world size 3, and the steps lost (since the checkpoint the grown attempt resumed)."""
    try:
        _wait_for_step(out, procs, LATE_AT, world=2)
        started = time.time()
        if launcher == RUN:
            bed.link(2, up=True)
        else:
            procs.append(again[0](2))
        return _grown(procs, out, started, result)
    except RuntimeError as e:
        result["error"] = str(e)
    finally:
        _clean_up(bed, 2, procs, result)
    return result


def _grown(running: list[subprocess.Popen], out: Path, since: float, result: dict) -> dict:
    """Once every launcher process in ``running`` ended (or TRIAL_S passed): whether the job grew to world size 3
    after ``since``, how soon its first step came, the steps lost, and whether it finished."""
    end = time.monotonic() + TRIAL_S
    while any(p.poll() is None for p in running) and time.monotonic() < end:
        time.sleep(POLL_S)
    steps = _steps(out)
    grown = next((s for s in steps if s["t"] > since and s["world"] == 3), None)
    before = [s["step"] for s in steps if s["t"] > since and s["world"] == 2 and (grown is None or s["t"] < grown["t"])]
    trained_at_2 = max(before, default=max((s["step"] for s in steps if s["t"] <= since), default=0))
    result.update(
        recovered_s=round(grown["t"] - since, 2) if grown else None, grew=grown is not None,
        steps_lost=max(0, trained_at_2 - grown["resumed"]) if grown else None,
        finished=all(p.poll() == 0 for p in running) and bool(steps) and steps[-1]["step"] == BACK_STEPS,
        exit_codes=[p.poll() for p in running], world_after=steps[-1]["world"] if steps else None)
    if not result["finished"]:  # why, in the launcher's words
        result["said"] = (out.parent / "output.txt").read_text(errors="replace").splitlines()[-12:]
    return result


def _clean_up(bed: Bed, victim: int, procs: list[subprocess.Popen], result: dict) -> None:
    """Every launcher process killed, the link up, and what the job left in the namespaces counted."""
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


def launchers_of(fault: str) -> tuple[str, ...]:
    return GROWS if fault in GROWING else LAUNCHERS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=1, help="trials of each launcher and fault")
    parser.add_argument("--faults", nargs="+", choices=FAULTS, default=list(FAULTS), help="the faults tried")
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
                for k, fault in enumerate(args.faults):
                    names = launchers_of(fault)
                    for j in range(len(names)):
                        launcher = names[(r + k + j) % len(names)]
                        folder = Path(tmp) / f"t{r}{k}{j}"
                        folder.mkdir()
                        t = trial(bed, launcher, fault, folder)
                        trials.append(t)
                        print(f"{fault}, {launcher}: " + json.dumps({k: v for k, v in t.items()
                                                                    if k not in ("launcher", "fault")}), flush=True)
        finally:
            bed.close()
    table: dict = {}
    for fault in args.faults:
        row: dict = {}
        for launcher in launchers_of(fault):
            ts = [t for t in trials if t["fault"] == fault and t["launcher"] == launcher]
            times = [t["recovered_s"] for t in ts if t.get("finished") and t.get("recovered_s") is not None]
            lost = [t["steps_lost"] for t in ts if t.get("steps_lost") is not None]
            row[launcher] = {"finished": sum(1 for t in ts if t.get("finished")), "trials": len(ts),
                             "median_recovered_s": statistics.median(times) if times else None,
                             **({"grew": sum(1 for t in ts if t.get("grew")),
                                 "median_steps_lost": statistics.median(lost) if lost else None}
                                if fault in GROWING else {})}
        b = row[TORCHRUN]["median_recovered_s"]
        for ours, key in ((RUN, "ratio_run_vs_torchrun"), (MANUAL, "ratio_manual_vs_torchrun")):
            a = row[ours]["median_recovered_s"] if ours in row else None
            row[key] = round(a / b, 2) if a and b else None
        table[fault] = row
    if set(args.faults) != set(FAULTS):  # some faults again: the others' results as they were
        previous = result_file.RESULTS / "lost_hosts.json"
        kept = json.loads(previous.read_text()) if previous.exists() else {"results": {}, "trials": []}
        table = {**{f: r for f, r in kept["results"].items() if f not in table}, **table}
        trials = [*(t for t in kept["trials"] if t["fault"] not in args.faults), *trials]
        table = {f: table[f] for f in FAULTS if f in table}
    out = result_file.write("lost_hosts", rounds=args.rounds, steps=STEPS, step_s=STEP_S, fault_at_step=FAULT_AT,
                            back_steps=BACK_STEPS, back_at_step=BACK_AT, late_at_step=LATE_AT, results=table,
                            trials=trials)
    for fault, row in table.items():
        when = {"back": "its return", "late": "its start"}.get(fault, "the fault")
        cells = "; ".join(f"{name}: finished {r['finished']} of {r['trials']}, next attempt's first step "
                          f"{'n/a' if r['median_recovered_s'] is None else format(r['median_recovered_s'], '.1f') + ' s'}"
                          f" after {when}" + (f", grew {r['grew']} of {r['trials']}, {r['median_steps_lost']} step(s) "
                                              f"lost" if "grew" in r else "")
                          for name, r in row.items() if name in LAUNCHERS)
        ratios = [f"{name} / torchrun {row[key]}x" for name, key in (("ssh", "ratio_run_vs_torchrun"),
                                                                     ("manual", "ratio_manual_vs_torchrun")) if row[key]]
        print(f"{fault}: {cells}" + "".join(f"; {r}" for r in ratios))
    print(f"written: {out}")


if __name__ == "__main__":
    main()
