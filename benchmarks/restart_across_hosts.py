"""A restart across hosts: torch elastic's machinery (torchrun, c10d rendezvous) against the runner's own (`run
launcher=manual`, the job's channel in host 0's store), on two network-namespace hosts of the test bed.

    .venv/bin/python benchmarks/restart_across_hosts.py [--rounds 3]

Needs root and what scripts/testbed.py needs: it brings up a bed of its own (``testbed.py up --hosts 2``, as the
tests' fixture does) and takes it down at the end, also when a trial fails. Each launcher runs the same
torchrun-style script (benchmarks/workloads/restart_ddp.py: a tiny DDP model, one all-reduce a step, 0.05 s a step,
40 steps), one process per host, one restart allowed:

* torchrun: ``torchrun --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=HOST0:PORT --rdzv-id=ID
  --max-restarts=1 --rdzv-conf=is_host=1|0 --local-addr=ADDR`` in each host, with GLOO_SOCKET_IFNAME=lan0. The last
  three are what torchrun needs where the host name resolves to 127.0.0.1, as here: without them its agent guesses
  from the host name whether it serves the rendezvous store, the address its workers get as MASTER_ADDR, and gloo
  the interface it listens on;
* the same with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: the workers' store is not the agent's, one shared for the
  whole job, but made anew each round (by the workers' rank 0), torch's advice when its restarts fail
  (pytorch/pytorch#135712): with the shared store the restarted workers can read the addresses of the workers of
  the attempt before (no prefix per attempt, torch/distributed/rendezvous.py ``_create_c10d_store``);
* run: ``run topology.hosts=[the two hosts, 1 device each] launcher=manual launcher.manual.host=I run_id=ID
  init=tcp launcher.max_restarts=1 -- restart_ddp.py`` in each host.

Once host 1's worker has done step --kill-at, it is sent SIGKILL (its pid from the file the script writes), and the
harness measures (a) the seconds from the kill until host 0's worker of attempt 1 is gone (a pidfd says so), (b) the
seconds from the kill until both hosts' new workers have done their first step of attempt 2 (the time the script
writes), (c) whether host 0's output names the killed rank with SIGKILL / signal 9 on one line, and each host's
launcher's exit status once the job is done. The launchers take turns, which goes first rotating from one round to
the next; every trial counts, nothing is retried. Medians over the trials that restarted; run / each torchrun.
Results: benchmarks/results/restart_across_hosts.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import result_file
from namespace_bed import Bed

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "workloads" / "restart_ddp.py"
BIN = Path(sys.executable).parent
TORCHRUN, RUN = "torchrun (c10d rendezvous)", "run (launcher=manual)"
OWN_STORE = "torchrun, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"  # its workers' store made anew each round (see below)
LAUNCHERS = (TORCHRUN, OWN_STORE, RUN)
STEPS, STEP_S = 40, 0.05
START_S, RESTART_S, END_S = 120.0, 120.0, 120.0  # deadlines: the first kill point, attempt 2's steps, the exits
AFTER_ERROR_S = 20.0  # after a trial went wrong: how long the launchers still running get to end by themselves
FIGURES = ("survivor_gone_s", "both_restarted_s", "whole_s")
POLL_S = 0.01  # how often the step files are read while waiting for one (their times are the script's own)
# a line of host 0's output about the failure at all (the first one is recorded), apart from torch's known noise
ABOUT_FAILURE = re.compile(r"(?i)fail|error|exception|sigkill|\bsignal\b|closed|reset|\brestart(s|ed|ing)?\b")
FRAME = re.compile(r'(\[rank\d+\]:)?\s+(File "|\^)')  # a traceback's frame lines
NOISE = re.compile(r"hostname of the client socket cannot be retrieved")
_FOREIGN_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_")  # as tests/testbed_fixtures.py: no other job's variables


def commands(bed: Bed, launcher: str, job_id: str, out: Path) -> tuple[list[list[str]], dict[str, str]]:
    """Each host's command line for ``launcher``, and what its environment adds."""
    script = [SCRIPT.name, "--out", str(out), "--steps", str(STEPS), "--step-s", str(STEP_S)]
    if launcher in (TORCHRUN, OWN_STORE):
        endpoint = f"{bed.hosts[0]['addr']}:{bed.free_port(0)}"
        env = {"GLOO_SOCKET_IFNAME": "lan0"} | ({"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"} if launcher == OWN_STORE
                                                else {})
        return [[str(BIN / "torchrun"), "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                 f"--rdzv-endpoint={endpoint}", f"--rdzv-id={job_id}", "--max-restarts=1",
                 f"--rdzv-conf=is_host={int(i == 0)}", f"--local-addr={h['addr']}", *script]
                for i, h in enumerate(bed.hosts)], env
    hosts = ", ".join(f"{{name: '{h['name']}', devices: 1}}" for h in bed.hosts)
    return [[str(BIN / "run"), "topology.nodes=null", "topology.devices_per_node=null", f"topology.hosts=[{hosts}]",
             "launcher=manual", f"launcher.manual.host={i}", f"run_id={job_id}", "init=tcp", "launcher.max_restarts=1",
             "--", *script] for i in range(len(bed.hosts))], {}


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _steps(out: Path, host: int) -> list[dict]:
    """What host ``host``'s workers wrote last (one record per worker, attempts included)."""
    found = (_read(p) for p in out.glob(f"host{host}.*.json"))
    return [m for m in found if m is not None]


def _wait(what: str, ready: Callable[[], object], deadline_s: float, launchers: list[subprocess.Popen]) -> object:
    """``ready()``'s first true value; an error naming ``what`` after ``deadline_s`` or once a launcher has ended."""
    deadline = time.monotonic() + deadline_s
    while not (value := ready()):
        ended = [i for i, p in enumerate(launchers) if p.poll() is not None]
        if ended:
            raise RuntimeError(f"host {ended[0]}'s launcher ended (exit {launchers[ended[0]].returncode}) before {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"not {what} within {deadline_s:g} s")
        time.sleep(POLL_S)
    return value


def trial(bed: Bed, launcher: str, folder: Path, kill_at: int) -> dict:
    """One job under ``launcher``: start both hosts, kill host 1's worker once it did step ``kill_at``, measure,
    let the job finish."""
    out = folder / "steps"
    out.mkdir(parents=True)
    argvs, extra = commands(bed, launcher, f"rb{uuid.uuid4().hex[:10]}", out)
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(_FOREIGN_PREFIXES) and k not in ("PYTHONPATH", "OMP_NUM_THREADS")}
    launchers, logs = [], []
    for i, argv in enumerate(argvs):
        cwd = folder / f"host{i}"  # each host's own folder, with the script, as on separate machines
        cwd.mkdir()
        (cwd / SCRIPT.name).write_text(SCRIPT.read_text())
        logs.append(cwd / "output.txt")
        env = {**base, **extra, "RESTART_BENCH_HOST": str(i)}
        with logs[-1].open("w") as log:
            launchers.append(subprocess.Popen(bed.exec_argv(i, argv), cwd=cwd, env=env, stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True))
    result: dict = {"launcher": launcher}
    try:
        started = time.monotonic()
        victim = _wait(f"host 1 at step {kill_at}", lambda: next((m for m in _steps(out, 1) if m["step"] >= kill_at),
                                                                 None), START_S, launchers)
        (survivor,) = _steps(out, 0)
        first = {0: survivor["pid"], 1: victim["pid"]}
        pidfd = os.pidfd_open(survivor["pid"])
        try:
            killed = time.monotonic()
            os.kill(victim["pid"], signal.SIGKILL)
            result["start_to_kill_s"] = killed - started
            gone, second = None, {}
            deadline = killed + RESTART_S
            while gone is None or len(second) < 2:
                if gone is None and select.select([pidfd], [], [], POLL_S)[0]:
                    gone = time.monotonic()  # host 0's worker of attempt 1 has exited
                elif gone is not None:
                    time.sleep(POLL_S)
                second = {h: m for h in (0, 1) for m in _steps(out, h) if m["pid"] != first[h]}  # attempt 2's
                if len(second) < 2 and (time.monotonic() > deadline or any(p.poll() is not None for p in launchers)):
                    raise RuntimeError(f"no attempt 2 on both hosts within {RESTART_S:g} s of the kill "
                                       f"(exits {[p.poll() for p in launchers]}; new workers on hosts "
                                       f"{sorted(second)})")
        finally:
            os.close(pidfd)
        result.update(killed_rank=victim["rank"], survivor_gone_s=gone - killed,
                      both_restarted_s=max(m["first_t"] for m in second.values()) - killed,
                      restart_counts=[second[h]["restart_count"] for h in (0, 1)])
        codes = []
        for p in launchers:
            codes.append(p.wait(timeout=max(1.0, END_S - (time.monotonic() - killed))))
        result["exit_codes"] = codes
        result["whole_s"] = time.monotonic() - started
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        result["error"] = str(e)
        for p in launchers:  # does the other host end by itself, once one has?
            try:
                p.wait(timeout=AFTER_ERROR_S)
            except subprocess.TimeoutExpired:
                pass
        result["exit_codes_after_error"] = [p.poll() for p in launchers]  # None: still running AFTER_ERROR_S later
    finally:
        for p in launchers:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        left = bed.pids()  # what a launcher left in the namespaces (its workers run in sessions of their own)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        result["left_running"] = len(left)
    said = logs[0].read_text(errors="replace").splitlines()
    if "error" in result:  # what each host said last, to see why (without tracebacks' frames)
        result["tails"] = [[line for line in log.read_text(errors="replace").splitlines()
                            if not NOISE.search(line) and not re.match(r"(\[rank\d+\]:)?\s", line)][-25:]
                           for log in logs]
    about = [line.strip() for line in said if ABOUT_FAILURE.search(line) and not NOISE.search(line)
             and not FRAME.match(line)]
    rank = result.get("killed_rank", 1)
    cause = re.compile(rf"\brank:? {rank}\b.*(SIGKILL|signal 9|exitcode: -9)|(SIGKILL|signal 9|exitcode: -9).*"
                       rf"\brank:? {rank}\b", re.I)
    result["host0_first_failure_line"] = about[0][:300] if about else None
    result["host0_cause_line"] = next((line.strip()[:300] for line in said if cause.search(line)), None)
    result["host0_names_cause"] = result["host0_cause_line"] is not None
    return result


def summarize(trials: list[dict]) -> dict:
    """One launcher's trials: medians over those that restarted (both hosts stepped in attempt 2), and counts."""
    restarted = [t for t in trials if "both_restarted_s" in t]
    med = {k: statistics.median(v) if (v := [t[k] for t in restarted if k in t]) else None for k in FIGURES}
    return {"median_s": med, "trials": len(trials), "restarted": len(restarted),
            "both_exit_0": sum(1 for t in trials if t.get("exit_codes") == [0, 0]),
            "names_cause": sum(1 for t in trials if t["host0_names_cause"]),
            "host0_first_failure_line": next((t["host0_first_failure_line"] for t in trials), None),
            "host0_cause_line": next((t["host0_cause_line"] for t in trials if t["host0_cause_line"]), None),
            "errors": [t["error"] for t in trials if "error" in t], "runs": trials}


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="trials of each launcher")
    parser.add_argument("--kill-at", type=int, default=10, help="host 1's worker is killed once it did this step")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("the namespace test bed needs root (scripts/testbed.py)")
    # a SIGTERM or SIGHUP ends the run through the finally below: the bed goes down
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, lambda signum, _: sys.exit(128 + signum))
    load_before = os.getloadavg()
    trials: dict[str, list[dict]] = {name: [] for name in LAUNCHERS}
    with tempfile.TemporaryDirectory(prefix="rah-") as tmp:
        bed = Bed(Path(tmp) / "bed", hosts=2, prefix="rb")
        try:
            for i in range(args.rounds):
                for j in range(len(LAUNCHERS)):  # which goes first rotates
                    launcher = LAUNCHERS[(i + j) % len(LAUNCHERS)]
                    t = trial(bed, launcher, Path(tmp) / f"round{i}-{j}", args.kill_at)
                    trials[launcher].append(t)
                    said = (f"host 0's worker gone {t['survivor_gone_s']:.2f} s after the kill, both hosts' attempt 2 "
                            f"stepped at {t['both_restarted_s']:.2f} s" if "both_restarted_s" in t else "")
                    print(f"round {i + 1}, {launcher}: {said}{'; ' if said and 'error' in t else ''}"
                          f"{'error: ' + t['error'] if 'error' in t else ''}; exits {t.get('exit_codes')}; host 0 "
                          f"names the cause: {t['host0_names_cause']}", flush=True)
        finally:
            bed.close()
    results = {name: summarize(ts) for name, ts in trials.items()}
    ratios = {ref: {k: results[RUN]["median_s"][k] / results[ref]["median_s"][k] for k in FIGURES}
              for ref in (TORCHRUN, OWN_STORE) if results[ref]["restarted"] and results[RUN]["restarted"]}
    out = result_file.write("restart_across_hosts", load_before=load_before, rounds=args.rounds, kill_at_step=args.kill_at,
                      steps=STEPS, step_s=STEP_S, results=results, ratio_run_vs=ratios)
    for name, r in results.items():
        med = r["median_s"]
        print(f"{name}: restarted {r['restarted']} of {r['trials']}, both hosts exit 0 {r['both_exit_0']} of "
              f"{r['trials']}; host 0's worker gone {_f(med['survivor_gone_s'])} s, both hosts stepped in attempt 2 "
              f"{_f(med['both_restarted_s'])} s after the kill (medians); host 0 names the killed rank and SIGKILL "
              f"{r['names_cause']} of {r['trials']}\n    host 0's first line on the failure: "
              f"{r['host0_first_failure_line']}")
    for ref, ratio in ratios.items():
        print(f"run / {ref}: host 0's worker gone {_f(ratio['survivor_gone_s'])}x, both hosts stepped in attempt 2 "
              f"{_f(ratio['both_restarted_s'])}x")
    print(f"written: {out}")


if __name__ == "__main__":
    main()
