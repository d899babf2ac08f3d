"""The GPU path in one call: ``bash scripts/gpu_checks.sh`` (which runs this module under one overall time limit).

Each check runs with its own time budget and prints one line; without CUDA every check says "skipped: no CUDA"
and the run still ends 0 (the CPU run proves the script itself works). Results: one file,
benchmarks/results/gpu_checks.json (the device, its driver, torch and CUDA versions, the command, each check's
status and figures), from which benchmarks/report.py writes REPORT.md's GPU section.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from sessions import in_session

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORK = HERE / "workloads"
RESULTS = HERE / "results" / "gpu_checks.json"
COMMAND = "bash scripts/gpu_checks.sh"
# the modes the runner offers (fairscale_fsdp is refused: tests/benchmarks/test_gpu_checks.py holds the two together)
SHARDING = ["none", "zero", "fsdp", "oss", "sdp"]
THROUGHPUT_STEPS = 300
_DEADLINE = [float("inf")]  # time.monotonic() by which the running check must end
_RUN_SHIM = "import sys; sys.argv[0] = 'run'; from runner.app.start import main; main()"


class CheckFailed(Exception):
    """A check's verdict: what it saw that it should not have."""


def launches(gpus: int) -> dict[str, list[str]]:
    """Every `run` command line the checks start on a machine with ``gpus`` GPUs (the words after `run`), by name.
    Paths in them are the workloads' (absolute) and the files a rank writes (relative to the folder `run` starts
    in). The unit tests validate each against a one-GPU machine, so no check of the one GPU run fails on its spec."""
    cuda = ["device=cuda", "topology=1x1"]
    return {
        "digits nccl": [*cuda, "backend=nccl"],
        "digits dp": [*cuda, "parallel=dp"],
        **{f"digits sharding={mode}": [*cuda, f"sharding={mode}"] for mode in SHARDING},
        "more gpus than there are": ["device=cuda", f"topology=1x{gpus + 1}"],
        "out of memory": [*cuda, "--", str(WORK / "gpu_oom.py")],
        "gloo cuda": ["device=cpu", "backend=gloo", "topology=1x2", "--", str(WORK / "gloo_cuda.py")],
        "fresh rank": [*cuda, "--", str(WORK / "gpu_fresh.py"), "fresh.json"],
        "ddp": [*cuda, "--", str(WORK / "gpu_ddp.py")],
        "throughput": [*cuda, "recipe=custom", "recipe.target=gpu_transformer:main", "recipe.global_batch_size=32",
                       f"+recipe.steps={THROUGHPUT_STEPS}", "+recipe.out=rate.txt"],
        **{f"launch 1x{n}": [f"topology=1x{n}", "device=cpu", "--", str(WORK / "tiny_ddp.py")] for n in (1, 4)},
    }


def _launch(name: str) -> list[str]:
    import torch

    return launches(torch.cuda.device_count())[name]


def run_cmd() -> list[str]:
    """`run`: the console script beside this interpreter, or runner.app.start:main (what the script calls)."""
    beside = Path(sys.executable).parent / "run"
    return [str(beside)] if beside.exists() else [sys.executable, "-c", _RUN_SHIM]


def torchrun_cmd() -> list[str]:
    found = shutil.which("torchrun")
    return [found] if found else [sys.executable, "-m", "torch.distributed.run"]


def sh(argv: list[str], budget_s: float, cwd: Path) -> tuple[int, str, float]:
    """(exit status, output, seconds) of one command in its own session; a command past its budget and every
    process of its session are killed (status -9)."""
    budget_s = max(1.0, min(budget_s, _DEADLINE[0] - time.monotonic()))  # never past the check's own budget
    ended = in_session(argv, cwd, budget_s)
    if ended.code is None:
        return -9, ended.output + f"\n(killed: past its {budget_s:.0f} s budget)", ended.seconds
    return ended.code, ended.output, ended.seconds


def run(args: list[str], budget_s: float, cwd: Path) -> tuple[int, str, float]:
    return sh([*run_cmd(), *args], budget_s, cwd)


def _tail(out: str, lines: int = 6) -> str:
    return "\n".join(out.strip().splitlines()[-lines:])


def _succeeded(code: int, out: str) -> None:
    if code != 0:
        raise CheckFailed(f"exit {code}: {_tail(out)}")


def check_gpu_tests(cwd: Path) -> dict:
    code, out, secs = sh([sys.executable, "-P", "-m", "pytest", "-p", "no:cacheprovider", "-q", "-m", "gpu",
                          str(REPO / "tests" / "gpu")], 120, REPO)
    _succeeded(code, out)
    return {"summary": out.strip().splitlines()[-1], "seconds": round(secs, 1)}


def _digits(name: str, cwd: Path, budget_s: float = 60) -> dict:
    code, out, secs = run(_launch(name), budget_s, cwd)
    _succeeded(code, out)
    found = re.search(r"final test accuracy: ([0-9.]+)", out)
    if not found or float(found[1]) < 0.9:
        raise CheckFailed(f"accuracy below 0.9 or not printed: {_tail(out)}")
    return {"accuracy": float(found[1]), "seconds": round(secs, 1)}


def check_digits_nccl(cwd: Path) -> dict:
    return _digits("digits nccl", cwd)


def check_dp(cwd: Path) -> dict:
    return _digits("digits dp", cwd)


def check_sharding(cwd: Path) -> dict:
    """Each sharding mode at world size 1 (the fairscale modes skipped where fairscale is not installed)."""
    import importlib.util

    figures: dict[str, object] = {}
    failed: list[str] = []
    for mode in SHARDING:
        if mode in ("oss", "sdp") and importlib.util.find_spec("fairscale") is None:
            figures[mode] = "skipped: fairscale not installed"
            continue
        try:
            figures[mode] = _digits(f"digits sharding={mode}", cwd)
        except CheckFailed as e:
            figures[mode] = f"fail: {e}"
            failed.append(mode)
    if failed:
        raise CheckFailed(f"modes failed: {failed}; {figures}")
    return figures


def check_too_many_gpus(cwd: Path) -> dict:
    import torch

    code, out, secs = run(_launch("more gpus than there are"), 30, cwd)
    if code != 2 or "topology.devices_per_node" not in out or "nothing was started" not in out:
        raise CheckFailed(f"expected exit 2 naming topology.devices_per_node; exit {code}: {_tail(out)}")
    return {"asked": torch.cuda.device_count() + 1, "exit": code, "seconds": round(secs, 1)}


def _session_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def check_oom(cwd: Path) -> dict:
    """A rank that runs out of GPU memory: its traceback reported, `run` fails, no process of the job left."""
    argv = [*run_cmd(), *_launch("out of memory")]
    ended = in_session(argv, cwd, max(1.0, min(60.0, _DEADLINE[0] - time.monotonic())))
    if ended.code is None:
        raise CheckFailed("`run` did not end within the check's budget")
    out = ended.output
    if ended.code == 0 or "OutOfMemoryError" not in out or "Traceback" not in out:
        raise CheckFailed(f"expected a failure with the rank's OutOfMemoryError traceback; exit {ended.code}: "
                          f"{_tail(out)}")
    if not _session_gone(ended.pid):
        os.killpg(ended.pid, signal.SIGKILL)
        raise CheckFailed("processes of the job were left after `run` ended")
    return {"exit": ended.code}


def check_gloo_cuda(cwd: Path) -> dict:
    code, out, secs = run(_launch("gloo cuda"), 60, cwd)
    _succeeded(code, out)
    if out.count("gloo all-reduce of a CUDA tensor = 3.0") != 2:
        raise CheckFailed(f"not both ranks reported the sum 3.0: {_tail(out)}")
    return {"ranks": 2, "seconds": round(secs, 1)}


def check_fresh_ranks(cwd: Path) -> dict:
    """The zygote and the agent never initialise CUDA (workloads/gpu_fresh.py says how that shows); a rank's CUDA
    generator is a fresh process's; 20 runs of an ordinary NCCL DDP script all end."""
    from workloads.gpu_fresh import zygote_or_agent_initialised

    code, out, _ = run(_launch("fresh rank"), 60, cwd)
    _succeeded(code, out)
    rank = json.loads((cwd / "fresh.json").read_text())
    code, out, _ = sh([sys.executable, str(WORK / "gpu_fresh.py"), "--fresh"], 60, cwd)
    _succeeded(code, out)
    fresh = json.loads(out.strip().splitlines()[-1])
    if (said := zygote_or_agent_initialised(rank)) is not None:
        raise CheckFailed(said)
    if {k: rank[k] for k in fresh} != fresh:
        raise CheckFailed(f"rank's CUDA generator {rank} is not a fresh process's {fresh}")
    ended = [sh([*run_cmd(), *_launch("ddp")], 45, cwd)[0] for _ in range(20)]
    if ended.count(0) != 20:
        raise CheckFailed(f"of 20 DDP runs, exit statuses {ended}")
    return {"ancestors": rank["ancestors"], "rank": rank["self"], "generator_as_fresh": True, "ddp_runs_ended": 20}


def check_throughput(cwd: Path, reps: int = 2) -> dict:
    """steps/s of the transformer under `run` against the hand-written single-process loop, interleaved."""
    rates: dict[str, list[float]] = {"run": [], "hand-written loop": []}
    shutil.copy(WORK / "gpu_transformer.py", cwd)  # the recipe's module in the folder `run` starts in, as a user's
    for i in range(reps):
        for name in (["run", "hand-written loop"] if i % 2 == 0 else ["hand-written loop", "run"]):
            out = cwd / "rate.txt"  # where both write their steps/s
            out.unlink(missing_ok=True)
            argv = ([*run_cmd(), *_launch("throughput")] if name == "run"
                    else [sys.executable, str(WORK / "gpu_transformer.py"), str(THROUGHPUT_STEPS), str(out)])
            code, text, _ = sh(argv, 90, cwd)
            _succeeded(code, text)
            rates[name].append(float(out.read_text()))
    med = {k: statistics.median(v) for k, v in rates.items()}
    ratio = med["run"] / med["hand-written loop"]
    return {"median_steps_per_s": med, "all": rates, "ratio": ratio, "target": 0.98, "met": ratio >= 0.98}


def check_launch(cwd: Path, reps: int = 3) -> dict:
    """Whole-command seconds of the 20-step tiny DDP script (gloo) under `run --` and torchrun --standalone."""
    figures = {}
    for n in (1, 4):
        times: dict[str, list[float]] = {"run --": [], "torchrun --standalone": []}
        for _ in range(reps):
            for name, argv in {"run --": [*run_cmd(), *_launch(f"launch 1x{n}")],
                               "torchrun --standalone": [*torchrun_cmd(), "--standalone", f"--nproc-per-node={n}",
                                                         str(WORK / "tiny_ddp.py")]}.items():
                code, out, secs = sh(argv, 60, cwd)
                _succeeded(code, out)
                times[name].append(secs)
        med = {k: statistics.median(v) for k, v in times.items()}
        figures[str(n)] = {"median_s": med, "all_s": times, "ratio": med["run --"] / med["torchrun --standalone"]}
    return figures


CHECKS: list[tuple[str, float, Callable[[Path], dict]]] = [
    ("gpu tests (tests/gpu, -m gpu)", 120, check_gpu_tests),
    ("run device=cuda backend=nccl topology=1x1 (digits)", 60, check_digits_nccl),
    ("parallel=dp over the GPU (digits)", 60, check_dp),
    ("each sharding mode at world size 1 (digits)", 150, check_sharding),
    ("more GPUs than the machine has: refused before launch", 30, check_too_many_gpus),
    ("out of memory in a rank: traceback, nothing left", 60, check_oom),
    ("gloo with CUDA tensors, 2 ranks on one GPU", 60, check_gloo_cuda),
    ("fresh ranks on CUDA (zygote/agent, generator, 20 DDP runs)", 150, check_fresh_ranks),
    ("throughput: transformer bf16, run vs hand-written loop", 120, check_throughput),
    ("launch time: run vs torchrun --standalone, 1 and 4 processes", 90, check_launch),
]


def device() -> dict:
    """The device kind, its driver, torch's and CUDA's versions (what the figures were measured with)."""
    import platform

    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cpus": os.cpu_count(), "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0}
    if info["gpus"]:
        info["name"] = torch.cuda.get_device_name(0)
        smi = shutil.which("nvidia-smi")
        query = [smi, "--query-gpu=driver_version", "--format=csv,noheader"] if smi else None
        info["driver"] = subprocess.run(query, capture_output=True, text=True).stdout.strip() if query else None
    return info


def one(name: str, budget_s: float, check: Callable[[Path], dict], cuda: bool) -> dict:
    """One check's record: status pass / fail / skipped, its seconds and figures; prints its one line."""
    if not cuda:
        record: dict[str, object] = {"status": "skipped: no CUDA"}
    else:
        _DEADLINE[0] = time.monotonic() + budget_s
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
            try:
                record = {"status": "pass", "figures": check(Path(tmp))}
            except (CheckFailed, OSError, ValueError, KeyError, subprocess.TimeoutExpired) as e:
                record = {"status": "fail", "why": f"{type(e).__name__}: {e}"[:2000]}
        record["seconds"] = round(time.monotonic() - t0, 1)
    said = str(record.get("why", "")).splitlines()[:1] or [json.dumps(record.get("figures", ""))[:160]]
    print(f"{name}: {record['status']}" + (f" ({record['seconds']} s) {said[0]}" if cuda else ""), flush=True)
    return {"check": name, "budget_s": budget_s, **record}


def main() -> int:
    import argparse

    import torch

    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()

    cuda = torch.cuda.is_available()
    info = device()  # before any check: the GPU's name and driver whatever happens after
    sys.path.insert(0, str(HERE))
    import report

    results: list[dict] = []
    for name, budget, check in CHECKS:  # written after each check: a run the overall limit cuts keeps what it found
        results.append(one(name, budget, check, cuda))
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps({"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                                       "command": COMMAND, "device": info, "cuda": cuda, "checks": results},
                                      indent=1) + "\n")
        report.update(names={"gpu"})
    failed = [r["check"] for r in results if r["status"] == "fail"]
    print(f"{len(results) - len(failed)} of {len(results)} checks passed or skipped; results: {RESULTS}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
