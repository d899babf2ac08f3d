"""Every default, count and number README.md and docs/ state about the code is the code's: each claim is a pattern of the
README's words (found exactly once, whitespace as it wraps) and the value the code has (the schema's dataclass
defaults through dataclasses.fields, the modules' constants, setup.sh's and pyproject.toml's settings, the digits
recipe's data, the committed benchmark results, torch's and fairscale's own defaults). The README's quotes of
`run --help` and `run --version` are what those print, and what it says `run` needs is pyproject.toml's."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import json
import math
import re
import signal
import subprocess
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from conftest import REPO, compose
from readme_text import docs
from runner.app.help import options_help
from runner.worker.attempt_state import HARD_STOP_MARGIN_S
from runner.common import exits
from runner.environments.process import SOCKET_IFNAME_VARIABLES
from runner.environments.provenance import DIFF_CAP_BYTES
from runner.environments.versions import DISTRIBUTION, Versions
from runner.launchers.slurm import follow as slurm_follow
from runner.launchers.slurm import job as slurm_job
from runner.launchers.ssh.host import KEEPALIVE_COUNT
from runner.launchers.ssh.protocol import BEATS_MISSED
from runner.plan.processes import PORT_BAND
from runner.plan.render import TABLE_HEAD
from runner.spec.schema import (
    DigitsRecipeConfig,
    InitConfig,
    LauncherConfig,
    LogConfig,
    ShardingConfig,
    SlurmOptions,
    SshOptions,
)
from runner.training import progress
from runner.training.checkpoints import CHUNK_BYTES
from runner.training.context import RunContext
from runner.worker.attempt_state import FAILURE_STOP_S
from runner.worker.rank_life import QUIET_S, STACKS_S, STALL_MARGIN_S
from runner.worker.preflight.checks import COLLECTIVE_TIMEOUT_S

pytestmark = pytest.mark.docs

SETUP = REPO / "scripts" / "setup.sh"


def default(schema: type, name: str) -> Any:
    """A field's default in the schema (its default_factory's value for a list or a dataclass)."""
    [found] = [f for f in dataclasses.fields(schema) if f.name == name]
    return found.default_factory() if found.default is dataclasses.MISSING else found.default


def said(value: Any) -> str:
    """A value as the README writes it: 10.0 as 10, True as true, an enum by its value."""
    value = getattr(value, "value", value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def words(value: float, **names: float) -> str:
    """A number the README says in a word (``second=1.0``): that word, or the number where none fits."""
    return next((word for word, number in names.items() if number == value), said(value))


def setup_default(variable: str) -> str:
    """The default scripts/setup.sh gives a variable (``NAME="${NAME:-default}"``)."""
    return re.search(rf'^{variable}="\$\{{{variable}:-([^}}]*)\}}"', SETUP.read_text(), re.M)[1]


def _default_job() -> tuple[int, int, int]:
    spec = compose()
    return spec.topology.nodes, spec.topology.devices_per_node, spec.topology.nodes * spec.topology.devices_per_node


def _private_mode(tmp_path) -> str:
    from runner.records.paths import RunPaths

    RunPaths.make_private(tmp_path / "rdzv")
    return f"0{(tmp_path / 'rdzv').stat().st_mode & 0o777:o}"


@dataclass(frozen=True)
class Claim:
    """A README phrase (a regex whose groups are the values) and what the code says they are."""

    pattern: str
    code: Callable[..., tuple[Any, ...] | Any]

    def values(self, **fixtures: Any) -> tuple[str, ...]:
        found = self.code(**fixtures) if self.code.__code__.co_argcount else self.code()
        return tuple(map(said, found if isinstance(found, tuple) else (found,)))


CLAIMS = [
    # rank endings (runner.worker.rank_life)
    Claim(r"that then neither ends nor does anything for (\d+) s \(its main", lambda: QUIET_S),
    Claim(r"ends it (\d+) s later, and the job's result stands", lambda: STACKS_S),
    Claim(r"each host agent ends the job itself, (\d+) s later", lambda: STALL_MARGIN_S),
    # setup and packaging
    Claim(r"`TORCH_VERSION=([\d.]+)` by default", lambda: setup_default("TORCH_VERSION")),
    Claim(r"The distribution is called `([\w-]+)`", lambda: _project()["name"]),
    Claim(r"`run ([\d.]+) \(([\w-]+)\), torch ([\d.]+)\+cpu, Python [\d.]+ \(<interpreter>\)`",
          lambda: (_project()["version"], DISTRIBUTION, setup_default("TORCH_VERSION"))),
    Claim(r"`error: recipe\.target: \.\.\. (needs [^`]+)`, `hint: ([^`]+)`", lambda: _missing_extra_of_the_default_recipe()),
    Claim(r"with Python ≥ ([\d.]+):",
          lambda: tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"].removeprefix(">=")),
    Claim(r"`pytest -m unit` runs the pure-logic tests \((no Python interpreter started and no torch imported);",
          lambda: re.search(r"unit: pure logic, (no Python interpreter started and no torch imported)",
                            " ".join(_pytest_settings()["markers"]))[1]),
    Claim(r'`-m "not (\w+)"` leaves out the namespace hosts', lambda: _marker("testbed")),
    Claim(r"`-m (\w+)` the README's and the docs' claims", lambda: _marker("docs")),
    # the default job
    Claim(r"the default job: digits, (\d+) host x (\d+) CPU processes", lambda: _default_job()[:2]),
    Claim(r"with (\d+) gloo processes, shows a progress bar", lambda: _default_job()[2]),
    Claim(r"digits: (\d+) train / (\d+) test images, 2 process", lambda: _digits_split()),
    Claim(r"step (\d+): epoch=(\d+) loss=[\d.]+ samples_per_s=\d+ test_accuracy=[\d.]+ train: 100%",
          lambda: (_digits_steps(), default(DigitsRecipeConfig, "epochs"))),
    Claim(r"train: 100%\|█+\| (\d+)/(\d+) \[[^\]]*\] final test accuracy: [\d.]+ after (\d+) steps",
          lambda: (_digits_steps(),) * 3),
    Claim(r"2 process\(es\), global batch (\d+) \((\d+) per process\), (\d+) epochs",
          lambda: (default(DigitsRecipeConfig, "global_batch_size"),
                   default(DigitsRecipeConfig, "global_batch_size") // _default_job()[2],
                   default(DigitsRecipeConfig, "epochs"))),
    # defaults of the schema
    Claim(r"Ranks still running `launcher\.grace_s` \((\d+) s\) after either", lambda: default(LauncherConfig, "grace_s")),
    Claim(r"more than `launcher\.snapshot_max_mb` \((\d+)\) is refused",
          lambda: default(LauncherConfig, "snapshot_max_mb")),
    Claim(r"`launcher\.stop_signal` \(default `(\w+)`", lambda: default(LauncherConfig, "stop_signal")),
    Claim(r"`launcher\.tasks=(\w+)` \(default\)", lambda: default(LauncherConfig, "tasks")),
    Claim(r"`launcher\.stall_timeout_s=\d+` \((\w+) by default\)",
          lambda: "unset" if default(LauncherConfig, "stall_timeout_s") is None else "set"),
    Claim(r"`launcher\.slurm\.signal` \(default `(\w+)@(\d+)`: SIG(\w+) (\d+) s before the time limit\)",
          lambda: (*default(SlurmOptions, "signal").split("@"), *default(SlurmOptions, "signal").split("@"))),
    Claim(r"GPUs are requested with `--([\w-]+)` \(or `launcher\.slurm\.gpu_request=gres`\)",
          lambda: default(SlurmOptions, "gpu_request")),
    Claim(r"`init\.dir` \(default: the (run folder)\)",
          lambda: "run folder" if default(InitConfig, "dir") is None else default(InitConfig, "dir")),
    Claim(r"the last `log\.collectives=(\d+)` of them", lambda: default(LogConfig, "collectives")),
    Claim(r"`log\.console=main\|all\|0,3` and `log\.collectives=(\d+)`", lambda: default(LogConfig, "collectives")),
    Claim(r"\| `TORCH_FR_BUFFER_SIZE` \| not set \| `(\d+)` \|", lambda: default(LogConfig, "collectives")),
    Claim(r"each host's first process by default \(`log\.console=(\w+)`\)", lambda: default(LogConfig, "console")),
    Claim(r"\(`sharding\.reshard_after_forward=(\w+)`, the default,",
          lambda: default(ShardingConfig, "reshard_after_forward")),
    Claim(r"`sharding\.reduce_buffer_size` \(sdp\): (\d+), the default here",
          lambda: default(ShardingConfig, "reduce_buffer_size")),
    Claim(r"fairscale's own default, 2\*\*(\d+),", lambda: _power_of_two(_fairscale_reduce_buffer_size())),
    Claim(r"`(\w+)\.pt` by default", lambda: inspect.signature(RunContext.save_checkpoint).parameters["name"].default),
    # launcher=ssh (its defaults, and the numbers of runner/launchers/ssh*.py and runner/app/ssh_host.py)
    Claim(r"must log in within `launcher\.ssh\.connect_timeout_s` \((\d+) s;",
          lambda: default(SshOptions, "connect_timeout_s")),
    Claim(r"\| `launcher\.ssh\.connect_timeout_s` \| `-o ConnectTimeout` \((\d+)\) \|",
          lambda: default(SshOptions, "connect_timeout_s")),
    Claim(r"`-o ServerAliveInterval` \((\d+), with `ServerAliveCountMax=(\d+)`\): a host that stops answering is lost "
          r"after (\d+) s", lambda: (default(SshOptions, "keepalive_s"), KEEPALIVE_COUNT,
                                     default(SshOptions, "keepalive_s") * KEEPALIVE_COUNT)),
    Claim(r"\| `launcher\.ssh\.command` \| the ssh client \(`([\w/.-]+)`\) \|", lambda: default(SshOptions, "command")),
    Claim(r"when it hears no beat from `run` for (\d+) × `keepalive_s`", lambda: BEATS_MISSED),
    Claim(r"and ends itself `launcher\.grace_s` \+ (\d+) s later at the latest",
          lambda: FAILURE_STOP_S + HARD_STOP_MARGIN_S),
    # numbers of the code
    Claim(r"long plans show the first and last (\d+) rows", lambda: TABLE_HEAD),
    Claim(r"the port is (\d+) \+ job id mod (\d+)", lambda: PORT_BAND),
    Claim(r"a failed `sacct` is tried again (\d+) s later, then twice as late after each failure, up to every (\d+) "
          r"minutes", lambda: (slurm_job.SACCT_RETRY_S, slurm_job.SACCT_RETRY_LONGEST_S / 60)),
    Claim(r"The output is copied every (\w+); the state is asked every (\w+) at first and after each change, then every "
          r"(\w+) of the time the job has been in its state, at most every (\d+) s",
          lambda: (words(slurm_follow.TAIL_S, second=1.0), words(slurm_follow.FIRST_S, second=1.0),
                   words(slurm_follow.FRACTION, tenth=0.1), slurm_follow.LONGEST_S)),
    Claim(r"at most every \d+ s: about (\d+) calls for an hour-long job", lambda: _about(_state_polls(3600.0))),
    Claim(r"sets `(\w+)` and `(\w+)` for its processes", lambda: SOCKET_IFNAME_VARIABLES),
    Claim(r"the same appears as plain lines, at every (\w+) of the steps, at least every (\w+)",
          lambda: (words(1 / progress.LINES_PER_TOTAL, tenth=0.1), words(progress.LINE_INTERVAL_S, minute=60.0))),
    Claim(r"rank 0 sends it in chunks of at most (\d+) MiB", lambda: CHUNK_BYTES / 2**20),
    Claim(r"the diff \(cut at (\d+) KiB\)", lambda: DIFF_CAP_BYTES / 1024),
    Claim(r"at most `min\(init\.timeout_s, (\d+) s\)`", lambda: COLLECTIVE_TIMEOUT_S),
    Claim(r"a folder only you may enter \((0\d+)\)", lambda tmp_path: _private_mode(tmp_path)),
    Claim(r"gets `init\.timeout_s` \(not torch's (\d+) minutes\)", lambda: _torch_timeout_minutes()),
    Claim(r"long before a (\d+)-minute backend timeout", lambda: _torch_timeout_minutes()),
    # what tests check
    Claim(r"the weights and Adam's moments after (\d+) steps of every mode", lambda: _sharding_test(r"^STEPS = (\d+)")),
    Claim(r"\(weights within rtol ([\de-]+), atol ([\de-]+);",
          lambda: _sharding_test(r'what\.startswith\("model"\):\s+rtol, atol = ([\de-]+), ([\de-]+)')),
    Claim(r"and (\d+) more steps equal (\d+) uninterrupted steps",
          lambda: (_sharding_test(r"train\(\*resumer, steps=(\d+),"), int(_sharding_test(r"steps=STEPS \+ (\d+)\)\["))
                   + int(_sharding_test(r"^STEPS = (\d+)")))),
    Claim(r"each process's optimizer state, measured in the run, is ([\d.]+)–([\d.]+)x of 1/world",
          lambda: _sharding_test(r"assert ([\d.]+) <= ratio <= ([\d.]+),")),
    # measured (benchmarks/results/)
    Claim(r"on CPU with gloo it is ~([\d.]+)–([\d.]+)x slower per step than DDP",
          lambda: tuple(f"{f(_step_ratios('fsdp')):.1f}" for f in (min, max))),
    Claim(r"the step time stays that of DDP \(measured below: ([\d.]+)–([\d.]+)x\)",
          lambda: tuple(f"{f(_step_ratios('zero', 'oss')):.2f}" for f in (min, max))),
    Claim(r"`none` holds parameters \((\d+) MiB\), gradients and DDP's bucket copy of them \((\d+) \+ (\d+)\), "
          r"Adam's moments \((\d+)\)", lambda: (_parameters_mib(),) * 3 + (2 * _parameters_mib(),)),
    Claim(r"`0` in one run: ([\d.]+)x the throughput at (\d+) processes \((\d+) vs (\d+) steps/s",
          lambda: _diagnosis_overhead()),
    Claim(r"Measured (\d{4}-\d\d-\d\d) [\d:–]+ UTC on this project's machine \((\w+), (\d+) cores, Linux (\d+\.\d+), "
          r"Python ([\d.]+), torch ([\w.+]+), gloo\)", lambda: _suite_machine()),
    Claim(r"\| whole-command time of a \d+-step DDP job, (\d+) processes \| `run` ([\d.]+) s = \*\*([\d.]+)×\*\* "
          r"`torchrun --standalone` \(([\d.]+) s\), ([\d.]+)× a bare torch\.multiprocessing script, "
          r"([\d.]+)× the floor", lambda: _launch_row(0)),
    Claim(r"\| the same, (\d+) processes \| `run` ([\d.]+) s = \*\*([\d.]+)×\*\* torchrun \(([\d.]+) s\), ([\d.]+)× "
          r"torch\.multiprocessing, ([\d.]+)× the floor \|", lambda: _launch_row(1)),
    Claim(r"\| training throughput vs a hand-written torch\.multiprocessing DDP loop \| "
          r"\*\*([\d.]+)×\*\* \((\d+) processes\), \*\*([\d.]+)×\*\* \((\d+)\) \|", lambda: _throughput_row()),
    Claim(r"\((\d+)–(\d+) steps/s for `run` and (\d+)–(\d+) for the reference in this run\)",
          lambda: _throughput_spread()),
    Claim(r"\| validation \+ plan, ([\d,]+) hosts × (\d+) devices \(([\d,]+) processes\) \| \*\*([\d.]+) s\*\* "
          r"\(grid\) / ([\d.]+) s \(named hosts\); time per process ([\d.]+)–([\d.]+)× that at ([\d,]+) hosts \|",
          lambda: _plan_row()),
    Claim(r"# validation \+ planning up to ([\d,]+) hosts x (\d+) devices", lambda: _plan_row()[:2]),
    Claim(r"\| optimizer state per process, sharded \(([\w, ]+)\) \| ([\d.]+)× at (\w+), ([\d.]+)× at (\w+) "
          r"of `sharding=none` \|", lambda: _optimizer_state_row()),
    Claim(r"\*\*Measured\*\* \(`benchmarks/sharding_memory\.py`, ([\d-]+), [^;]*fairscale ([\d.]+), gloo; a ([\d.]+)M-parameter "
          r"MLP, (\d+) x Linear\((\d+), \d+\), Adam, global batch (\d+);",
          lambda: (_sharding()["date"], re.search(r"fairscale ([\d.]+)", _sharding()["machine"])[1],
                   f"{_sharding()['params'] / 1e6:.1f}", _sharding()["depth"], _sharding()["width"],
                   _sharding()["global_batch"])),
    # exit statuses
    Claim(r"Ctrl-C \(or SIGTERM\) stops the job that is running and the rest of the sweep; `run` exits (\d+) \((\d+)\)",
          lambda: (exits.from_signal(signal.SIGINT), exits.from_signal(signal.SIGTERM))),
    Claim(r"say `stopped \(SIGUSR1\)`, and `run` then exits (\d+)\)", lambda: exits.from_signal(signal.SIGUSR1)),
    Claim(r"exit 128 \+ the signal \((\d+), (\d+)\)",
          lambda: (exits.from_signal(signal.SIGINT), exits.from_signal(signal.SIGTERM))),
    # the run folder's records
    Claim(r"rank 0 adds `(\w+)` \(the torch, CUDA", lambda tmp_path: _runtime_key(tmp_path)),
]


def _missing_extra_of_the_default_recipe() -> tuple[str, str]:
    """What validation says of the default recipe's extra when it is missing (runner.common.extras): the words from
    "needs", and the hint."""
    from runner.common.extras import RECIPE_EXTRAS

    [extra] = RECIPE_EXTRAS[default(DigitsRecipeConfig, "target").split(":")[0]]
    return "needs " + extra.missing().split(" needs ", 1)[1], extra.install


def _runtime_key(tmp_path) -> str:
    """The key under which rank 0 adds what it loaded to provenance.json (runner.environments.provenance)."""
    from runner.environments.provenance import add_runtime

    (tmp_path / "provenance.json").write_text("{}")
    add_runtime(tmp_path / "provenance.json", {}, "node0", 1)
    [key] = json.loads((tmp_path / "provenance.json").read_text())
    return key


def _pytest_settings() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]


def _marker(name: str) -> str:
    """``name`` if pyproject.toml declares the pytest marker."""
    return name if any(m.startswith(f"{name}:") for m in _pytest_settings()["markers"]) else "(no such marker)"


def _sharding_test(pattern: str) -> str | tuple[str, ...]:
    """What tests/training/test_sharding.py (the README's "Equivalence") has where ``pattern`` finds it."""
    found = re.search(pattern, (REPO / "tests" / "training" / "test_sharding.py").read_text(), re.M)
    return found[1] if found.re.groups == 1 else found.groups()


def _sharding() -> dict[str, Any]:
    return json.loads((REPO / "benchmarks" / "results" / "sharding_memory.json").read_text())


def _step_ratios(*modes: str) -> list[float]:
    """The step time of ``modes`` against `none`'s, at every shape measured."""
    return [r["modes"][m]["ratio_vs_none"]["step_s"] for r in _sharding()["results"].values() for m in modes]


def _parameters_mib() -> int:
    """The measured MLP's parameters in MiB (float32: 4 bytes each)."""
    return round(_sharding()["params"] * 4 / 2**20)


def _optimizer_state_row() -> tuple[str, ...]:
    """The sharded modes, and at each shape the one ratio of optimizer state against `none` they all have."""
    results = _sharding()["results"]
    modes = [m for m in next(iter(results.values()))["modes"] if m != "none"]
    row: list[str] = [", ".join(modes)]
    for shape, result in results.items():
        [ratio] = {f"{result['modes'][m]['ratio_vs_none']['optimizer_state_bytes']:.2f}" for m in modes}
        row += [ratio, shape]
    return tuple(row)


def _result(name: str) -> dict[str, Any]:
    return json.loads((REPO / "benchmarks" / "results" / f"{name}.json").read_text())


def _diagnosis_overhead() -> tuple[str, ...]:
    """benchmarks/diagnosis_overhead.py at its smallest size: the ratio, and the medians recording and not."""
    results = _result("diagnosis_overhead")["results"]
    size = min(results, key=int)
    medians = results[size]["median_steps_per_s"]
    recording = next(v for k, v in medians.items() if k.startswith("recording"))
    other = next(v for k, v in medians.items() if k.startswith("not recording"))
    return f"{results[size]['ratio']:.3f}", size, f"{recording:.0f}", f"{other:.0f}"


def _suite_machine() -> tuple[str, ...]:
    """benchmarks/results/suite.json: the day, and the machine (its kernel's version from the platform string)."""
    suite = _result("suite")
    machine = suite["machine"]
    kernel = re.match(r"Linux-(\d+\.\d+)", machine["platform"])[1]
    return suite["date"][:10], machine["machine"], machine["cpus"], kernel, machine["python"], machine["torch"]


def _launch_row(index: int) -> tuple[str, ...]:
    """benchmarks/launch_speed.py's whole-command times at its ``index``-th size: `run`'s median, its ratio to
    torchrun, torchrun's median, its ratios to the torch.multiprocessing script and to the floor."""
    launch = _result("launch_speed")["launch"]
    size = sorted(launch, key=int)[index]
    r, run = launch[size], "run (recipe)"
    return (size, f"{r['median_s'][run]:.2f}", f"{r['ratio_vs_torchrun'][run]:.2f}",
            f"{r['median_s']['torchrun --standalone']:.2f}", f"{r['ratio_vs_mp_spawn'][run]:.2f}",
            f"{r['ratio_vs_floor'][run]:.2f}")


def _throughput_row() -> tuple[str, ...]:
    throughput = _result("launch_speed")["throughput"]
    return tuple(x for size in sorted(throughput, key=int) for x in (f"{throughput[size]['ratio']:.3f}", size))


def _throughput_spread() -> tuple[str, ...]:
    """The slowest and fastest repetition of `run` and of the reference at the smallest size (steps/s)."""
    throughput = _result("launch_speed")["throughput"]
    every = throughput[min(throughput, key=int)]["all"]
    return tuple(f"{f(every[name]):.0f}" for name in ("run", "hand-written mp DDP") for f in (min, max))


def _plan_row() -> tuple[str, ...]:
    """benchmarks/plan_scale.py at its largest size: hosts, devices, processes, the seconds of a grid and of named
    hosts, the range of time per process against the reference size, and that size."""
    data = _result("plan_scale")
    hosts = max(r["hosts"] for r in data["rows"])
    largest = {r["form"]: r for r in data["rows"] if r["hosts"] == hosts}
    ratios = [r["ratio_vs_1000"] for r in largest.values()]
    return (f"{hosts:,}", largest["grid"]["devices_per_host"], f"{largest['grid']['processes']:,}",
            f"{largest['grid']['seconds']:.2f}", f"{largest['named']['seconds']:.2f}", f"{min(ratios):.2f}",
            f"{max(ratios):.2f}", f"{data['reference_hosts']:,}")


def _digits_split() -> tuple[int, int]:
    """The default digits job's train and test images (its default test fraction and seed)."""
    from runner.recipes.digits import datasets

    if importlib.util.find_spec("sklearn") is None:  # its data file: the extra ``examples``
        pytest.skip("scikit-learn is not installed")

    train, test = datasets(default(DigitsRecipeConfig, "test_fraction"), default(DigitsRecipeConfig, "seed"))
    return len(train), len(test)


def _digits_steps() -> int:
    """The default digits job's steps: each epoch the whole global batches of its training images (ctx.loader drops
    an incomplete one by default)."""
    batches = _digits_split()[0] / default(DigitsRecipeConfig, "global_batch_size")
    whole = inspect.signature(RunContext.loader).parameters["drop_last"].default
    return (math.floor(batches) if whole else math.ceil(batches)) * default(DigitsRecipeConfig, "epochs")


def _fairscale_reduce_buffer_size() -> int:
    """ShardedDataParallel's own default (the extra ``fairscale``)."""
    data_parallel = pytest.importorskip("fairscale.nn.data_parallel")
    return inspect.signature(data_parallel.ShardedDataParallel.__init__).parameters["reduce_buffer_size"].default


def _power_of_two(value: int) -> int | str:
    """``n`` where ``value`` is 2**n (the README writes it so), else the value itself."""
    return value.bit_length() - 1 if value > 0 and value & (value - 1) == 0 else f"not a power of two: {value}"


def _state_polls(seconds: float) -> int:
    """How often a followed Slurm job's state is asked in ``seconds`` of one state (slurm_follow.PollSchedule)."""
    schedule, now, calls = slurm_follow.PollSchedule(), 0.0, 0
    while now < seconds:
        schedule.asked(now, changed=False)
        calls, now = calls + 1, schedule.next_at
    return calls


def _about(count: int) -> int:
    """A count as the README gives it with "about": to the nearest 50."""
    return round(count / 50) * 50


def _project() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _torch_timeout_minutes() -> float:
    from torch.distributed.constants import default_pg_timeout

    return default_pg_timeout.total_seconds() / 60


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("claim", CLAIMS, ids=[c.pattern[:60] for c in CLAIMS])
def test_the_readme_says_what_the_code_has(claim: Claim, tmp_path) -> None:
    found = re.findall(claim.pattern, _flat(docs().text))
    assert len(found) == 1, f"README.md and docs/ say this {len(found)} times, not once: {claim.pattern}"
    values = found[0] if isinstance(found[0], tuple) else (found[0],)
    assert values == claim.values(tmp_path=tmp_path), f"README.md or docs/: {claim.pattern}"


def test_the_readme_quotes_the_help_as_run_prints_it() -> None:
    """`run --help` "lists the groups and every option with its default and what it does (`launcher.grace_s=10.0
    Seconds the ranks get ... ...`)": the quote, but its closing "...", is a line of the options `run --help` prints."""
    [quote] = re.findall(r"with its default and what it does \(`([^`]+) \.\.\.`", _flat(docs().text))
    assert _flat(quote) in _flat(options_help()), quote


def test_the_version_line_is_what_run_version_prints() -> None:
    """`run --version`'s line in the README, the interpreter's path as `<interpreter>`, is Versions.line()'s form."""
    [quote] = re.findall(r"`(run [^`]+ \(<interpreter>\))`", _flat(docs().text))
    versions = Versions.parse(quote)
    assert versions is not None, quote
    assert versions.line().replace(sys.executable, "<interpreter>") == quote


def test_the_readme_names_what_run_itself_needs() -> None:
    """"`run` itself needs torch, Hydra (hydra-core, omegaconf), PyYAML, psutil and tqdm": pyproject.toml's
    dependencies (an extra's packages are the extras table's, tests/common/test_extras.py)."""
    [said] = re.findall(r"`run` itself needs ([^;]+);", _flat(docs().text))
    said = re.sub(r"\w+ \(([^)]+)\)", r"\1", said)  # Hydra (hydra-core, omegaconf): the distributions
    names = {n.strip().lower() for n in re.split(r",|\band\b", said) if n.strip()}
    needed = {re.match(r"[\w.-]+", d)[0].lower() for d in _project()["dependencies"]}
    assert names == needed


# --------------------------------------------------------------------------- setup.sh's choice of torch build


def _torch_install_line() -> str:
    [line] = [line.strip() for line in SETUP.read_text().splitlines() if re.search(r"pip install .*torch==", line)]
    return line


@pytest.mark.parametrize("index", ["", "https://download.pytorch.org/whl/cpu"])
def test_setup_passes_torch_index_url_to_pip_for_torch_only(index: str) -> None:
    """setup.sh's torch install line, as bash expands it (pip replaced by an echo): --index-url only when
    TORCH_INDEX_URL is set, and never for the package's own install."""
    script = (f'TORCH_INDEX_URL="${{TORCH_INDEX_URL:-}}"; TORCH_VERSION=2.13.0; '
              f'pip() {{ printf "%s\\n" "$@"; }}; {_torch_install_line()}')
    done = subprocess.run(["bash", "-euc", script], env={"TORCH_INDEX_URL": index, "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=10)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["install", "--no-compile", *(["--index-url", index] if index else []),
                                      "torch==2.13.0"]
    assert setup_default("TORCH_INDEX_URL") == ""
    package = [line for line in SETUP.read_text().splitlines() if re.search(r"pip install .*-e \"\.\[", line)]
    assert package and not any("index-url" in line for line in package)


def test_the_readme_says_which_torch_setup_installs() -> None:
    """Not "the CPU build": pip's index gives what it gives; the README names the variable and the CPU index."""
    flat = _flat(docs().text)
    assert "CPU build of torch" not in flat
    assert "`TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/setup.sh`" in flat
    assert "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in SETUP.read_text()
