"""The real `run` console script, as a subprocess, in a fresh folder (so outputs/ lands there).

Every call passes device=cpu (or device=cuda with a launcher that does not count GPUs here) so
that validation never imports torch to count GPUs: each call then takes about half a second.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import REPO, TARGET
from runs import RUN, Finished, started, user_env

EXAMPLES = REPO / "examples" / "jobs"
WRITTEN = ("spec.yaml", "plan.json", "launch.txt")


def run_cli(cwd: Path, *args: str, timeout: float = 120, env: dict[str, str] | None = None) -> Finished:
    """`run ARGS` as typed (no run id added), in a user's shell with ``env`` added."""
    with started([RUN, *args], cwd=cwd, env=user_env(env)) as proc:
        return proc.wait(timeout)


def run_folders(cwd: Path) -> list[Path]:
    """Every Hydra run folder under cwd/outputs (a folder holding .hydra/)."""
    return sorted(p.parent for p in (cwd / "outputs").rglob(".hydra"))


def only_run_folder(cwd: Path) -> Path:
    folders = run_folders(cwd)
    assert len(folders) == 1, folders
    return folders[0]


def explain(r: Finished) -> str:
    return f"exit {r.code}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}"


# ------------------------------------------------------------------------------ a valid dry run


def test_dry_run_slurm_writes_spec_plan_and_script(tmp_path: Path) -> None:
    r = run_cli(tmp_path, "dry_run=true", f"recipe.target={TARGET}", "topology=2x2", "init=file", "launcher=slurm",
                "device=cpu")
    assert r.code == 0, explain(r)
    out = r.stdout
    for section in ("== spec ==", "== verdict ==", "== plan ==", "== launch (slurm) =="):
        assert section in out
    assert "valid: 4 process(es) on 2 host(s) (2+2); device cpu, backend gloo, init file" in out
    # the plan rows: rank node local host device environment
    rows = re.findall(r"^\s+(\d+)\s+(\d+)\s+(\d+)\s+(node\d)\s+cpu\s+RANK=(\d+) LOCAL_RANK=(\d+) WORLD_SIZE=4 "
                      r"LOCAL_WORLD_SIZE=2 GROUP_RANK=(\d+)", out, re.M)
    assert [tuple(map(str, x)) for x in rows] == [
        ("0", "0", "0", "node0", "0", "0", "0"), ("1", "0", "1", "node0", "1", "1", "0"),
        ("2", "1", "0", "node1", "2", "0", "1"), ("3", "1", "1", "node1", "3", "1", "1")]
    assert "sbatch --parsable" in out and "#SBATCH --nodes=2" in out
    assert "dry run: nothing was started" in out
    assert "Traceback" not in out + r.stderr

    folder = only_run_folder(tmp_path)
    for name in (*WRITTEN, "job.sbatch"):
        assert (folder / name).is_file(), name
    spec = OmegaConf.load(folder / "spec.yaml")
    run_id = spec.run_id  # pinned by the launch: tasks load this file
    assert run_id and spec.topology.nodes == 2 and spec.launcher.kind == "slurm"
    assert f"for run {run_id};" in out and f"--job-name=run-{run_id}" in out
    plan = json.loads((folder / "plan.json").read_text())
    assert plan["world_size"] == 4 and len(plan["processes"]) == 4
    assert [p["env"]["RANK"] for p in plan["processes"]] == ["0", "1", "2", "3"]
    assert plan["init_method"] == f"file://{folder}/{run_id}.rdzv/attempt0"
    launch = (folder / "launch.txt").read_text()
    assert launch.rstrip() in out  # the dry run prints exactly what the folder keeps
    script = (folder / "job.sbatch").read_text()
    assert launch.endswith(f"# --- job.sbatch ---\n{script}")  # the batch script, last and whole
    assert f"runner.app.task {folder}/spec.yaml" in script


def test_dry_run_inside_an_allocation_is_an_srun_step(tmp_path: Path) -> None:
    r = run_cli(tmp_path, "dry_run=true", f"recipe.target={TARGET}", "topology=2x2", "launcher=slurm",
                "launcher.tasks=per_device", "device=cpu", env={"SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": "2"})
    assert r.code == 0, explain(r)
    assert "# this allocation: an srun step inside the current allocation" in r.stdout
    assert "srun --kill-on-bad-exit=1 --nodes=2 --ntasks=4 --ntasks-per-node=2" in r.stdout
    folder = only_run_folder(tmp_path)
    assert not (folder / "job.sbatch").exists() and "sbatch" not in (folder / "launch.txt").read_text()


def test_dry_run_local_has_no_batch_script(tmp_path: Path) -> None:
    r = run_cli(tmp_path, "dry_run=true", f"recipe.target={TARGET}", "topology=1x2", "device=cpu")
    assert r.code == 0, explain(r)
    assert "== launch (local) ==" in r.stdout and "forks 2 process(es)" in r.stdout
    folder = only_run_folder(tmp_path)
    assert all((folder / n).is_file() for n in WRITTEN)
    assert not (folder / "job.sbatch").exists()


# ------------------------------------------------------------------------------ invalid specs: exit 2

INVALID = [
    pytest.param(("topology.nodez=2",), ["topology.nodez"], id="misspelt-key"),
    pytest.param(("topology.nodes=abc",), ["topology.nodes", "abc"], id="wrong-type"),
    pytest.param(("launcher=kubernetes",), ["launcher/kubernetes", "slurm"], id="unknown-option"),
    pytest.param(("recipe=script",), ["recipe.path"], id="missing-value"),
    pytest.param(("topology=2x2", "launcher=local"), ["launcher.kind", "nothing was started"], id="validation-error"),
    pytest.param(("init.master_port=70000", "recipe.global_batch_size=0", "backend=nccl"),
                 ["init.master_port", "recipe.global_batch_size", "backend.name", "3 error(s)"], id="three-errors"),
]


REAL_LAUNCH = [p for p in INVALID if p.id in ("misspelt-key", "validation-error")]


def _dry(params):
    return [pytest.param("dry_run=true", *p.values, id=p.id) for p in params]


def _real(params):
    return [pytest.param("dry_run=false", *p.values, id=f"{p.id}-no-dry-run") for p in params]


@pytest.mark.parametrize("dry_run, overrides, fragments", _dry(INVALID) + _real(REAL_LAUNCH))
def test_invalid_spec_exits_2(tmp_path: Path, dry_run, overrides, fragments) -> None:
    r = run_cli(tmp_path, dry_run, f"recipe.target={TARGET}", "device=cpu", *overrides)
    assert r.code == 2, explain(r)
    for fragment in fragments:
        assert fragment in r.stderr, explain(r)
    assert "Traceback" not in r.stdout + r.stderr
    assert "== plan ==" not in r.stdout
    # nothing was started: no run folder got a spec, a plan, commands or logs
    for folder in run_folders(tmp_path):
        assert not any((folder / n).exists() for n in (*WRITTEN, "job.sbatch", "logs")), sorted(folder.iterdir())


# ------------------------------------------------------------------------------ a user's own config folder

MYJOB = """\
# A user's job on top of the built-in groups, with a cluster of their own
defaults:
  - job_schema
  - topology: 2x8
  - init: env
  - launcher: slurm
  - backend: auto
  - parallel: ddp
  - sharding: none
  - recipe: digits
  - _self_

hydra:
  run:
    dir: outputs/${now:%Y-%m-%d}/${now:%H-%M-%S}_${runner_uid:}

device: cuda
recipe:
  target: runner.recipes.digits
  global_batch_size: 96
launcher:
  slurm:
    partition: gpu
    time: "04:00:00"
"""

MYCLUSTER = """\
defaults:
  - /schema/topology/base@_here_
  - _self_

hosts:
  - name: gpu-a
    addr: 10.0.0.1
    devices: 2
  - name: gpu-b
    addr: 10.0.0.2
    devices: 1
"""


@pytest.fixture
def user_dir(tmp_path: Path) -> Path:
    (tmp_path / "jobs" / "topology").mkdir(parents=True)
    (tmp_path / "jobs" / "myjob.yaml").write_text(MYJOB)
    (tmp_path / "jobs" / "topology" / "mycluster.yaml").write_text(MYCLUSTER)
    return tmp_path


def test_user_config_name(user_dir: Path) -> None:
    r = run_cli(user_dir, "--config-dir", "jobs", "--config-name", "myjob", "dry_run=true")
    assert r.code == 0, explain(r)
    assert "valid: 16 process(es) on 2 host(s) (8+8); device cuda, backend nccl" in r.stdout
    script = (only_run_folder(user_dir) / "job.sbatch").read_text()
    assert "#SBATCH --partition=gpu" in script and "#SBATCH --time=04:00:00" in script
    assert "#SBATCH --gpus-per-node=8" in script


def test_user_group_option_with_builtin_job(user_dir: Path) -> None:
    r = run_cli(user_dir, "--config-dir", "jobs", "topology=mycluster", "launcher=manual", "device=cpu",
                f"recipe.target={TARGET}", "recipe.global_batch_size=3", "dry_run=true")
    assert r.code == 0, explain(r)
    assert "valid: 3 process(es) on 2 host(s) (2+1)" in r.stdout
    assert "MASTER_ADDR=10.0.0.1" in r.stdout
    launch = (only_run_folder(user_dir) / "launch.txt").read_text()
    assert launch.count(f"run --config-dir {user_dir}/jobs topology=mycluster") == 2
    assert "# host 1 (10.0.0.2): starts 1 process(es)" in launch


def test_user_config_and_group_option_together(user_dir: Path) -> None:
    r = run_cli(user_dir, "--config-dir", "jobs", "--config-name", "myjob", "topology=mycluster", "launcher=mpi",
                "recipe.global_batch_size=3", "dry_run=true")
    assert r.code == 0, explain(r)
    assert "-np 3 -H 10.0.0.1:2,10.0.0.2:1" in r.stdout


# ------------------------------------------------------------------------------ examples/jobs, used as shipped


def test_examples_exist() -> None:
    assert (EXAMPLES / "asr-2x8.yaml").is_file() and (EXAMPLES / "topology" / "mycluster.yaml").is_file()


def asr_script(cwd: Path) -> None:
    """The example job's training script, where it says (validation checks it exists)."""
    (cwd / "asr").mkdir()
    (cwd / "asr" / "train.py").write_text("print('training')\n")


def test_example_asr_2x8(tmp_path: Path) -> None:
    asr_script(tmp_path)
    r = run_cli(tmp_path, "--config-dir", str(EXAMPLES), "--config-name", "asr-2x8", "dry_run=true")
    assert r.code == 0, explain(r)
    assert "valid: 16 process(es) on 2 host(s) (8+8); device cuda, backend nccl" in r.stdout
    assert "launcher slurm (per_device)" in r.stdout
    folder = only_run_folder(tmp_path)
    script = (folder / "job.sbatch").read_text()
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=8", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --partition=gpu", "#SBATCH --time=12:00:00", "#SBATCH --mem=256G"):
        assert line in script
    spec = OmegaConf.load(folder / "spec.yaml")
    assert spec.recipe.path == "asr/train.py" and spec.backend.env.NCCL_DEBUG == "WARN"
    plan = json.loads((folder / "plan.json").read_text())
    assert plan["processes"][0]["env"]["NCCL_DEBUG"] == "WARN"


def test_example_mycluster_manual(tmp_path: Path) -> None:
    r = run_cli(tmp_path, "--config-dir", str(EXAMPLES), "topology=mycluster", "launcher=manual", "device=cuda",
                f"recipe.target={TARGET}", "recipe.global_batch_size=3", "dry_run=true")
    assert r.code == 0, explain(r)
    plan = json.loads((only_run_folder(tmp_path) / "plan.json").read_text())
    assert [h["host"] for h in plan["hosts"]] == ["gpu-a", "gpu-b"]
    assert [p["env"]["CUDA_VISIBLE_DEVICES"] for p in plan["processes"]] == ["0,1", "0,1", "3"]
    assert [p["device"] for p in plan["processes"]] == ["cuda:0", "cuda:1", "cuda:0"]
    assert "cd " in r.stdout and f"--config-dir {EXAMPLES}" in r.stdout


def test_example_any_shape_on_top(tmp_path: Path) -> None:
    asr_script(tmp_path)
    r = run_cli(tmp_path, "--config-dir", str(EXAMPLES), "--config-name", "asr-2x8", "topology=3x4", "dry_run=true")
    assert r.code == 0, explain(r)
    assert "valid: 12 process(es) on 3 host(s) (4+4+4)" in r.stdout


# ------------------------------------------------------------------------------ multirun


def test_multirun_two_topologies(tmp_path: Path) -> None:
    r = run_cli(tmp_path, "-m", "topology=1x1,1x2", "dry_run=true", f"recipe.target={TARGET}", "device=cpu")
    assert r.code == 0, explain(r)
    folders = [f for f in run_folders(tmp_path) if (f / "spec.yaml").exists()]
    assert len(folders) == 2, folders
    specs = [OmegaConf.load(f / "spec.yaml") for f in folders]
    ids = [s.run_id for s in specs]
    assert len(set(ids)) == 2 and all(ids)
    assert sorted(s.topology.devices_per_node for s in specs) == [1, 2]
    assert sorted(json.loads((f / "plan.json").read_text())["world_size"] for f in folders) == [1, 2]
    assert "Traceback" not in r.stdout + r.stderr



def test_multirun_over_shapes_that_are_no_files(tmp_path: Path) -> None:
    """topology=NxM for unshipped shapes in a sweep: each job's own shape; the override stays as typed (the job's
    override_dirname, what the sweep summary shows as its configuration)."""
    r = run_cli(tmp_path, "-m", "topology=1x1,3x1,1x3", "dry_run=true", f"recipe.target={TARGET}", "device=cpu",
                "recipe.global_batch_size=3", "launcher=slurm")
    assert r.code == 0, explain(r)
    folders = [f for f in run_folders(tmp_path) if (f / "spec.yaml").exists()]
    shapes = sorted((s.topology.nodes, s.topology.devices_per_node) for s in map(OmegaConf.load,
                                                                                 (f / "spec.yaml" for f in folders)))
    assert shapes == [(1, 1), (1, 3), (3, 1)]
    choices = sorted(OmegaConf.load(f / ".hydra" / "hydra.yaml").hydra.runtime.choices.topology for f in folders)
    assert choices == ["1x1", "1x3", "3x1"]
    overrides = sorted(OmegaConf.load(f / ".hydra" / "overrides.yaml")[0] for f in folders)
    assert overrides == ["topology=1x1", "topology=1x3", "topology=3x1"]


def test_shapes_from_a_job_files_defaults_and_a_users_own_shape_file(tmp_path: Path) -> None:
    """``override /topology: 3x4`` in a job file of --config-dir composes a 3x4 grid; a user's own
    ``topology/1x5.yaml`` there wins over the grid that name would otherwise make."""
    (tmp_path / "jobs" / "topology").mkdir(parents=True)
    (tmp_path / "jobs" / "big.yaml").write_text("defaults:\n  - job\n  - override /topology: 3x4\n  - override /launcher: slurm\n"
                                               f"  - _self_\ndevice: cpu\nrecipe: {{target: {TARGET}}}\n")
    (tmp_path / "jobs" / "topology" / "1x5.yaml").write_text(
        "defaults:\n  - /schema/topology/base@_here_\n  - _self_\nhosts: [{name: a, devices: 2}, {name: b, devices: 1}]\n")
    r = run_cli(tmp_path, "--config-dir", "jobs", "--config-name", "big", "recipe.global_batch_size=12", "dry_run=true")
    assert r.code == 0, explain(r)
    assert "valid: 12 process(es) on 3 host(s) (4+4+4)" in r.stdout
    r = run_cli(tmp_path, "--config-dir", "jobs", "topology=1x5", "launcher=manual", "device=cpu",
                f"recipe.target={TARGET}", "recipe.global_batch_size=3", "dry_run=true")
    assert r.code == 0, explain(r)
    assert "valid: 3 process(es) on 2 host(s) (2+1)" in r.stdout

def test_help_lists_groups(tmp_path: Path) -> None:
    r = run_cli(tmp_path, "--help")
    assert r.code == 0, explain(r)
    for group in ("topology", "launcher", "init", "backend", "parallel", "sharding", "recipe"):
        assert group in r.stdout


def test_help_shows_every_option_with_its_default_and_doc(tmp_path: Path) -> None:
    """Each group's keys, with the schema's default and the first line of the field's docstring."""
    r = run_cli(tmp_path, "--help")
    assert r.code == 0, explain(r)
    assert re.search(r"^  launcher\.grace_s=10\.0 +Seconds the ranks get to checkpoint and stop after SIGTERM before they "
                     r"are\s+killed\.$", r.stdout, flags=re.M), r.stdout
    for line in ("  init.timeout_s=300.0 ", "  launcher.slurm.signal=USR1@90 ", "  recipe.global_batch_size=64 ",
                 "  sharding.mode=none ", "  log.collectives=200 "):
        assert line in r.stdout, line
    assert r.stdout.rstrip().endswith("Hydra's own options: run --hydra-help")  # the footer still comes last


def test_cfg_job_prints_composed_spec(tmp_path: Path) -> None:
    r = run_cli(tmp_path, "--cfg", "job", "topology=2x2", "launcher=slurm")
    assert r.code == 0, explain(r)
    cfg = OmegaConf.create(r.stdout)
    assert cfg.topology.nodes == 2 and cfg.launcher.kind == "slurm"
    assert list(tmp_path.iterdir()) == []  # printed, nothing composed into a run folder


# ------------------------------------------------------------------------------ extending the built-in job

INHERIT = """\
defaults:
  - job
  - override topology: 2x2
  - override launcher: slurm
  - _self_

device: cpu
recipe:
  target: runner.recipes.digits
"""


def test_user_config_can_build_on_the_builtin_job(tmp_path: Path) -> None:
    """``defaults: [job, override topology: 2x2, _self_]``: a user's job file that extends the built-in
    one. (This broke once: a hydra.searchpath in conf/job.yaml is allowed only in the primary config.)"""
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "inherit.yaml").write_text(INHERIT)
    r = run_cli(tmp_path, "--config-dir", "jobs", "--config-name", "inherit", "dry_run=true")
    assert r.code == 0, explain(r)
    assert "valid: 4 process(es) on 2 host(s)" in r.stdout
    assert "#SBATCH --nodes=2" in (only_run_folder(tmp_path) / "job.sbatch").read_text()


# ------------------------------------------------------------------------------ regressions


def test_manual_commands_keep_the_config_name(user_dir: Path) -> None:
    """The per-host manual commands once dropped ``--config-name myjob``: each host would have composed
    the built-in `job`, a different spec from the one validated here."""
    r = run_cli(user_dir, "--config-dir", "jobs", "--config-name", "myjob", "topology=mycluster", "launcher=manual",
                "device=cpu", "recipe.global_batch_size=3", "dry_run=true")
    assert r.code == 0, explain(r)
    launch = (only_run_folder(user_dir) / "launch.txt").read_text()
    commands = [l for l in launch.splitlines() if l.startswith("cd ")]
    assert len(commands) == 2
    assert all("--config-name myjob" in c for c in commands), commands


def test_run_version_says_the_runner_and_torch_and_starts_nothing(tmp_path: Path) -> None:
    """`run --version`: what launcher=ssh asks every host before it starts anything (runner.launchers.ssh.check)."""
    from runner.environments.versions import Versions, installed

    r = run_cli(tmp_path, "--version")
    assert r.code == 0 and r.stderr == "", explain(r)
    assert r.stdout == installed().line() + "\n" and Versions.parse(r.stdout) == installed()
    assert not (tmp_path / "outputs").exists()


def test_run_ssh_host_without_the_spec_on_stdin_says_what_it_is(tmp_path: Path) -> None:
    r = run_cli(tmp_path, "--ssh-host", "0", str(tmp_path / "runs" / "x"), timeout=60)  # stdin: empty
    assert r.code == 2 and "`run --ssh-host` is started by launcher=ssh" in r.stderr, explain(r)
    assert not (tmp_path / "runs").exists()
