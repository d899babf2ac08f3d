"""Golden files for every launch command the dry run prints (tests/golden/<case>.txt).

Each case composes a spec through Hydra, validates it against a FixedProbe, plans it with fixed
run paths (/runs/R1, run id R1) and materializes the launcher's request with a fixed invocation
(/venv/bin/python in /work/proj). The text must equal the golden file byte for byte.

    UPDATE_GOLDEN=1 python -m pytest tests/test_golden_commands.py   # rewrite the files, then review the diff
"""

from __future__ import annotations

import functools
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import GOLDEN, TARGET, compose, environment, hosts_override, validate
from runner.launchers import LAUNCHERS, Invocation
from runner.launchers import plan_for
from runner.records.paths import RunPaths
from runner.spec.pins import pinned

pytestmark = pytest.mark.unit

PATHS = RunPaths(root=Path("/runs/R1"), run_id="R1")
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"


@dataclass(frozen=True)
class Case:
    name: str
    overrides: tuple[str, ...]
    probe: tuple[tuple[str, object], ...] = ()
    in_allocation: bool = False
    config_dir: str | None = None
    env: tuple[tuple[str, str], ...] = ()  # the environment `run` has (launcher.ssh.export reads it)


def case(name, *overrides, probe=None, in_allocation=False, config_dir=None, env=None) -> Case:
    flat: list[str] = []
    for o in overrides:
        flat.extend(o if isinstance(o, tuple) else (o,))
    return Case(name, tuple(flat), tuple((probe or {}).items()), in_allocation, config_dir, tuple((env or {}).items()))


AB = hosts_override({"name": "a", "devices": 2}, {"name": "b", "devices": 2})
AB_HETERO = hosts_override({"name": "a", "devices": 2}, {"name": "b", "devices": 1})
NAMED_ADDR = hosts_override({"name": "gpu-a", "addr": "10.0.0.1", "devices": 2},
                            {"name": "gpu-b", "addr": "10.0.0.2", "devices": 1})

CASES = [
    case("local_1x2", "topology=1x2", "device=cpu"),
    case("local_named_host_cuda", *hosts_override({"name": "thishost", "devices": 4, "gpus": [0, 1, 2, 3]}),
         "device=cuda", probe={"cuda_devices": 4}),
    case("manual_2_hosts", *NAMED_ADDR, "launcher=manual", "device=cpu", "recipe.global_batch_size=60",
         # pinned keys the user typed are replaced; a value with a space and shell characters is quoted
         "run_id=old", "init.master_port=1234", "dry_run=true", "launcher.manual.host=0",
         "+backend.env={NCCL_DEBUG: 'INFO $HOME'}", config_dir="/work/proj/jobs"),
    case("manual_2_hosts_file_init", *AB, "launcher=manual", "device=cpu", "init=file", "init.dir=/shared"),
    case("mpi_per_device_uniform", *AB, "launcher=mpi", "device=cpu"),
    case("mpi_per_device_hetero", *AB_HETERO, "launcher=mpi", "device=cpu", "recipe.global_batch_size=60"),
    case("mpi_per_host", *AB, "launcher=mpi", "launcher.tasks=per_host", "device=cpu"),
    case("mpi_options", *NAMED_ADDR, "launcher=mpi", "device=cuda", "recipe.global_batch_size=60",
         "launcher.mpi.mpirun=/opt/ompi/bin/mpirun", "launcher.mpi.allow_run_as_root=true",
         "launcher.mpi.oversubscribe=true", "launcher.mpi.extra=[-x,NCCL_DEBUG,--mca,btl_tcp_if_include,eth0]"),
    case("mpi_single_unnamed_host", "topology=1x4", "launcher=mpi", "device=cpu"),
    case("slurm_per_host_2x2_cpu", "topology=2x2", "launcher=slurm", "device=cpu"),
    case("slurm_per_device_2x2_cpu", "topology=2x2", "launcher=slurm", "launcher.tasks=per_device", "device=cpu"),
    case("slurm_per_device_hetero_2_1", "topology=hetero_2_1", "launcher=slurm", "launcher.tasks=per_device",
         "device=cpu", "recipe.global_batch_size=60"),
    case("slurm_cuda_gpus_per_node", "topology=2x8", "launcher=slurm", "launcher.tasks=per_device", "device=cuda"),
    case("slurm_cuda_gres", "topology=2x8", "launcher=slurm", "device=cuda", "launcher.slurm.gpu_request=gres"),
    case("slurm_options", "topology=2x2", "launcher=slurm", "device=cuda", "launcher.slurm.partition=gpu",
         "launcher.slurm.account=proj-42", "launcher.slurm.qos=high", "launcher.slurm.cpus_per_task=8",
         "launcher.slurm.mem=64G", "launcher.slurm.time=2-00:00:00", "launcher.slurm.signal=B:USR2@300",
         "launcher.slurm.requeue=true", "launcher.slurm.extra=['--constraint=a100|h100','--exclusive']"),
    case("slurm_in_allocation", "topology=2x2", "launcher=slurm", "launcher.tasks=per_device", "device=cpu",
         in_allocation=True),
    case("slurm_in_allocation_per_host", "topology=2x8", "launcher=slurm", "device=cuda", in_allocation=True),
    case("ssh_2_hosts_hetero", *AB_HETERO, "launcher=ssh", "device=cpu", "recipe.global_batch_size=60", "init=tcp"),
    # every option; exported values and a workdir that a shell would read as syntax are quoted (HOME is not set)
    case("ssh_options", *NAMED_ADDR, "launcher=ssh", "device=cpu", "recipe.global_batch_size=60",
         "workdir='/work/my proj'", "launcher.ssh.command=/usr/bin/ssh", "launcher.ssh.user=alice",
         "launcher.ssh.port=2222", "launcher.ssh.identity_file=/home/alice/.ssh/id_ed25519",
         "launcher.ssh.config_file=/home/alice/.ssh/cluster_config", "launcher.ssh.connect_timeout_s=5",
         "launcher.ssh.keepalive_s=0", "launcher.ssh.options=['ProxyJump=bastion','StrictHostKeyChecking=accept-new']",
         "launcher.ssh.export=[HF_HOME,WANDB_MODE,HOME]", "launcher.ssh.run=/opt/venv/bin/run",
         probe={"dirs": frozenset({"/work/my proj"})}, env={"HF_HOME": "/data/hf cache", "WANDB_MODE": "$(rm -rf ~); 'offline'"}),
]


@functools.lru_cache(maxsize=None)
def checked(c: Case):
    got = validate(compose(f"recipe.target={TARGET}", *c.overrides), **dict(c.probe))
    assert got.valid, got.rendered()
    return got


def materialize(c: Case) -> str:
    got = checked(c)
    kind = LAUNCHERS[got.job.spec.launcher.kind]
    job = pinned(got.job, kind.pins(got.job, PATHS))  # as the launch pins it, before the plan
    invocation = Invocation(python="/venv/bin/python", cwd="/work/proj", overrides=c.overrides, config_dir=c.config_dir)
    inside = environment(SLURM_JOB_ID="42") if c.in_allocation else environment()
    inside = inside.with_exported(kind.exported_names(job.spec), dict(c.env))  # as `run` reads them, by name
    return kind(plan=plan_for(job, PATHS), paths=PATHS, invocation=invocation, environment=inside).request().materialize()


@pytest.mark.parametrize("c", CASES, ids=[c.name for c in CASES])
def test_golden(c: Case) -> None:
    text = materialize(c)
    path = GOLDEN / f"{c.name}.txt"
    if UPDATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} is missing: run with UPDATE_GOLDEN=1 and review it"
    assert text == path.read_text(), f"{c.name}: the launch text changed (UPDATE_GOLDEN=1 rewrites {path})"


def test_no_stale_golden_files() -> None:
    names = {f"{c.name}.txt" for c in CASES}
    assert {p.name for p in GOLDEN.glob("*.txt")} == names


def test_every_launcher_has_a_golden_case() -> None:
    kinds = {checked(c).job.spec.launcher.kind for c in CASES}
    assert kinds == set(LAUNCHERS)


# ------------------------------------------------------------------- what the golden files must say


def _lines(name: str) -> list[str]:
    return (GOLDEN / f"{name}.txt").read_text().splitlines()


def test_golden_manual_commands_parse_back() -> None:
    """Each host's line is a valid shell command that repeats the user's overrides and pins the rest."""
    cmds = [l for l in _lines("manual_2_hosts") if l.startswith("cd ")]
    assert len(cmds) == 2
    for i, line in enumerate(cmds):
        words = shlex.split(line)
        assert words[:4] == ["cd", "/work/proj", "&&", "run"]
        assert words[4:6] == ["--config-dir", "/work/proj/jobs"]
        assert "+backend.env={NCCL_DEBUG: 'INFO $HOME'}" in words  # survived quoting intact
        assert "run_id=R1" in words and "run_id=old" not in words
        assert "init.master_port=1234" in words  # the user's fixed port is the pinned one
        assert not any(w.startswith("dry_run=") for w in words)
        assert words[-1] == f"launcher.manual.host={i}"
        assert [w for w in words if w.startswith("launcher.manual.host=")] == [f"launcher.manual.host={i}"]


def test_golden_mpi_slots_follow_ranks() -> None:
    assert "-np 3 -H a:2,b:1 --map-by slot" in _lines("mpi_per_device_hetero")[-1]
    assert "-np 2 -H a:1,b:1 --map-by slot" in _lines("mpi_per_host")[-1]
    assert "-np 4 -H a:2,b:2 --map-by slot" in _lines("mpi_per_device_uniform")[-1]
    assert "-np 4 -H localhost:4" in _lines("mpi_single_unnamed_host")[-1]


def test_golden_slurm_hostfile_places_ranks_2_plus_1() -> None:
    text = (GOLDEN / "slurm_per_device_hetero_2_1.txt").read_text()
    assert "counts=(2 1)" in text
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2" in text
    assert "--nodes=2 --ntasks=3 --distribution=arbitrary" in text
    assert "--ntasks-per-node" not in text.splitlines()[-1]
