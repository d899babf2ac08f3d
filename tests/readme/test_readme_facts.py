"""Every default, count and number README.md states about the code is the code's: each claim is a pattern of the
README's words (found exactly once, whitespace as it wraps) and the value the code has (the schema's dataclass
defaults through dataclasses.fields, the modules' constants, setup.sh's and pyproject.toml's settings)."""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import subprocess
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from conftest import REPO, compose
from readme_text import readme
from runner.common import exits
from runner.environments.provenance import DIFF_CAP_BYTES
from runner.launchers import slurm_follow, slurm_job
from runner.plan.processes import PORT_BAND
from runner.plan.render import TABLE_HEAD
from runner.spec.schema import (
    DigitsRecipeConfig,
    InitConfig,
    LauncherConfig,
    LogConfig,
    ShardingConfig,
    SlurmOptions,
)
from runner.training import progress
from runner.training.checkpoints import CHUNK_BYTES
from runner.worker.preflight.checks import COLLECTIVE_TIMEOUT_S

pytestmark = pytest.mark.unit

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
    # setup and packaging
    Claim(r"`TORCH_VERSION=([\d.]+)` by default", lambda: setup_default("TORCH_VERSION")),
    Claim(r"with Python ≥ ([\d.]+):",
          lambda: tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"].removeprefix(">=")),
    Claim(r"`pytest -m unit` runs the pure-logic tests \((about [^;]+);", lambda: re.search(
        r"pytest -m unit runs them in ([^;]+);", " ".join(_pytest_settings()["markers"]))[1]),
    Claim(r'`-m "not (\w+)"` leaves out the namespace hosts', lambda: _marker("testbed")),
    # the default job
    Claim(r"the default job: digits, (\d+) host x (\d+) CPU processes", lambda: _default_job()[:2]),
    Claim(r"with (\d+) gloo processes, shows a progress bar", lambda: _default_job()[2]),
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
    Claim(r"\| `TORCH_FR_BUFFER_SIZE` \| not set \| `(\d+)` \|", lambda: default(LogConfig, "collectives")),
    Claim(r"each host's first process by default \(`log\.console=(\w+)`\)", lambda: default(LogConfig, "console")),
    Claim(r"\(`sharding\.reshard_after_forward=(\w+)`, the default,",
          lambda: default(ShardingConfig, "reshard_after_forward")),
    Claim(r"`sharding\.reduce_buffer_size` \(sdp\): (\d+), the default here",
          lambda: default(ShardingConfig, "reduce_buffer_size")),
    # numbers of the code
    Claim(r"long plans show the first and last (\d+) rows", lambda: TABLE_HEAD),
    Claim(r"the port is (\d+) \+ job id mod (\d+)", lambda: PORT_BAND),
    Claim(r"a failed `sacct` is tried again (\d+) s later, then twice as late after each failure, up to every (\d+) "
          r"minutes", lambda: (slurm_job.SACCT_RETRY_S, slurm_job.SACCT_RETRY_LONGEST_S / 60)),
    Claim(r"The output is copied every (\w+); the state is asked every (\w+) at first and after each change, then every "
          r"(\w+) of the time the job has been in its state, at most every (\d+) s",
          lambda: (words(slurm_follow.TAIL_S, second=1.0), words(slurm_follow.FIRST_S, second=1.0),
                   words(slurm_follow.FRACTION, tenth=0.1), slurm_follow.LONGEST_S)),
    Claim(r"the same appears as plain lines, at every (\w+) of the steps, at least every (\w+)",
          lambda: (words(1 / progress.LINES_PER_TOTAL, tenth=0.1), words(progress.LINE_INTERVAL_S, minute=60.0))),
    Claim(r"rank 0 sends it in chunks of at most (\d+) MiB", lambda: CHUNK_BYTES / 2**20),
    Claim(r"the diff \(cut at (\d+) KiB\)", lambda: DIFF_CAP_BYTES / 1024),
    Claim(r"at most `min\(init\.timeout_s, (\d+) s\)`", lambda: COLLECTIVE_TIMEOUT_S),
    Claim(r"a folder only you may enter \((0\d+)\)", lambda tmp_path: _private_mode(tmp_path)),
    Claim(r"gets `init\.timeout_s` \(not torch's (\d+) minutes\)", lambda: _torch_timeout_minutes()),
    # what tests check
    Claim(r"the weights and Adam's moments after (\d+) steps of every mode", lambda: _sharding_test(r"^STEPS = (\d+)")),
    Claim(r"\(weights within rtol ([\de-]+), atol ([\de-]+);",
          lambda: _sharding_test(r'what\.startswith\("model"\):\s+rtol, atol = ([\de-]+), ([\de-]+)')),
    Claim(r"and (\d+) more steps equal (\d+) uninterrupted steps",
          lambda: (_sharding_test(r"train\(\*resumer, steps=(\d+),"), int(_sharding_test(r"steps=STEPS \+ (\d+)\)\["))
                   + int(_sharding_test(r"^STEPS = (\d+)")))),
    # measured (benchmarks/results/)
    Claim(r"on CPU with gloo it is ~([\d.]+)–([\d.]+)x slower per step than DDP",
          lambda: tuple(f"{f(_fsdp_step_ratios()):.1f}" for f in (min, max))),
    Claim(r"\*\*Measured\*\* \(`benchmarks/sharding_memory\.py`, ([\d-]+), [^;]*fairscale ([\d.]+), gloo; a ([\d.]+)M-parameter "
          r"MLP, (\d+) x Linear\((\d+), \d+\), Adam, global batch (\d+);",
          lambda: (_sharding()["date"], re.search(r"fairscale ([\d.]+)", _sharding()["machine"])[1],
                   f"{_sharding()['params'] / 1e6:.1f}", _sharding()["depth"], _sharding()["width"],
                   _sharding()["global_batch"])),
    # exit statuses
    Claim(r"Ctrl-C \(or SIGTERM\) stops the job that is running and the rest of the sweep; `run` exits (\d+) \((\d+)\)",
          lambda: (exits.from_signal(signal.SIGINT), exits.from_signal(signal.SIGTERM))),
    Claim(r"say `stopped \(SIGUSR1\)`, and `run` then exits (\d+)\)", lambda: exits.from_signal(signal.SIGUSR1)),
]


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


def _fsdp_step_ratios() -> list[float]:
    return [r["modes"]["fsdp"]["ratio_vs_none"]["step_s"] for r in _sharding()["results"].values()]


def _torch_timeout_minutes() -> float:
    from torch.distributed.constants import default_pg_timeout

    return default_pg_timeout.total_seconds() / 60


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("claim", CLAIMS, ids=[c.pattern[:60] for c in CLAIMS])
def test_the_readme_says_what_the_code_has(claim: Claim, tmp_path) -> None:
    found = re.findall(claim.pattern, _flat(readme().text))
    assert len(found) == 1, f"README.md says this {len(found)} times, not once: {claim.pattern}"
    values = found[0] if isinstance(found[0], tuple) else (found[0],)
    assert values == claim.values(tmp_path=tmp_path), f"README.md: {claim.pattern}"


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
    assert done.stdout.splitlines() == ["install", *(["--index-url", index] if index else []), "torch==2.13.0"]
    assert setup_default("TORCH_INDEX_URL") == ""
    package = [line for line in SETUP.read_text().splitlines() if 'pip install -e ".[' in line]
    assert package and not any("index-url" in line for line in package)


def test_the_readme_says_which_torch_setup_installs() -> None:
    """Not "the CPU build": pip's index gives what it gives; the README names the variable and the CPU index."""
    flat = _flat(readme().text)
    assert "CPU build of torch" not in flat
    assert "`TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/setup.sh`" in flat
    assert "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in SETUP.read_text()
