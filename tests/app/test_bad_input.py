"""Malformed specs and overrides: each gets exit status 2, a message that names the key, no traceback, and
nothing started.

A handful go through the real `run` (:data:`CLI`: a Hydra type error, an unknown key and option, YAML and
override syntax, a job file's unknown key, a recipe that does not import, a shell metacharacter: exit 2, no plan,
no logs, no process of the run left). The rest are refused by what `run` calls before it starts anything, and are
checked in-process, step by step as `run` takes them (:func:`refusal`): the command line
(runner.app.argv_checks.input_problems), Hydra's composition, the typed spec (runner.app.cli.typed_spec) and validation
(runner.launchers.validate)."""

from __future__ import annotations

import re
import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from conftest import compose_config
from runner.app.argv_checks import input_problems
from runner.app.cli import SpecRefused, typed_spec
from runner.launchers import validate
from runner.spec.probe import LocalProbe, tried_once
from runner.spec.problems import render_problems
from readme_text import docs
from runs import RUN, nothing_left, user_env

pytestmark = pytest.mark.timeout(300)


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    fragments: tuple[str, ...]  # each must appear in what `run` says
    files: tuple[tuple[str, str], ...] = ()  # (name, text) written to a config folder passed as --config-dir


def case(id: str, *args: str, says: tuple[str, ...] | str, files: dict[str, str] | None = None) -> Case:
    return Case(id, args, (says,) if isinstance(says, str) else says, tuple((files or {}).items()))


BROKEN_YAML = "defaults:\n  - job\n  - _self_\ntopology: {nodes: 2\n"
UNKNOWN_KEY_JOB = "defaults:\n  - job\n  - _self_\ngpus_per_host: 4\n"
CASES = [
    # wrong types
    case("nodes-not-a-number", "topology.nodes=two", says=("topology.nodes", "two")),
    case("devices-fractional", "topology.devices_per_node=1.5", says="topology.devices_per_node"),
    case("timeout-not-a-number", "init.timeout_s=soon", says="init.timeout_s"),
    case("port-not-a-number", "init.master_port=http", says="init.master_port"),
    case("requeue-not-a-bool", "launcher.slurm.requeue=maybe", says="launcher.slurm.requeue"),
    case("hosts-not-a-list", "topology.hosts=a", says="topology.hosts"),
    # unknown keys and options
    case("misspelt-key", "topology.nodez=2", says="topology.nodez"),
    case("added-unknown-key", "+topology.gpus_per_host=2", says="gpus_per_host"),
    case("unknown-host-key", "topology.hosts=[{name: a, gpu: 1}]", says="gpu"),
    case("unknown-init", "init=udp", says=("init/udp", "env")),
    case("unknown-launcher", "launcher=kubernetes", says=("launcher/kubernetes", "slurm")),
    case("unknown-backend", "backend=tpu", says="backend/tpu"),
    case("unknown-parallel", "parallel=fsdp", says="parallel/fsdp"),
    case("unknown-sharding", "sharding=zero3", says="sharding/zero3"),
    case("unknown-task-mode", "launcher.tasks=per_node", says=("launcher.tasks", "per_node")),
    case("unknown-device", "device=gpu", says=("device", "gpu")),
    case("bad-shape", "topology=3x", says="topology/3x"),
    # negative or zero counts
    case("zero-nodes", "topology.nodes=0", says="topology.nodes"),
    case("negative-nodes", "topology.nodes=-1", says="topology.nodes"),
    case("zero-devices", "topology.devices_per_node=0", says="topology.devices_per_node"),
    case("zero-shape", "topology=0x2", says="topology"),
    case("port-out-of-range", "init.master_port=70000", says="init.master_port"),
    case("negative-port", "init.master_port=-5", says="init.master_port"),
    case("zero-timeout", "init.timeout_s=0", says="init.timeout_s"),
    case("zero-batch", "recipe.global_batch_size=0", says="recipe.global_batch_size"),
    case("batch-smaller-than-world", "topology=1x2", "recipe.global_batch_size=1",
         says=("recipe.global_batch_size", "1 over world size 2")),
    case("micro-batch-larger-than-global", "recipe.micro_batch_size=65",
         says=("recipe.micro_batch_size", "65 is larger than the global batch 64")),
    case("negative-restarts", "launcher.max_restarts=-1", says="launcher.max_restarts"),
    case("negative-grace", "launcher.grace_s=-3", says=("launcher.grace_s", "got -3.0")),
    # shell metacharacters and unsafe names
    case("host-with-semicolon", "launcher=manual", "topology.hosts=[{name: 'a;rm -rf ~', devices: 1}, {name: b}]",
         says="topology.hosts[0]"),
    case("host-with-command-substitution", "launcher=manual", "topology.hosts=[{name: '$(reboot)'}, {name: b}]",
         says="topology.hosts[0]"),
    case("host-with-space", "launcher=mpi", "topology.hosts=[{name: 'a b'}, {name: b}]", says="topology.hosts[0]"),
    case("master-with-backticks", "init.master_addr='`id`'", says="init.master_addr"),
    case("ifname-with-semicolon", "backend.socket_ifname='eth0;ls'", says="backend.socket_ifname"),
    case("run-id-path", "run_id=../../etc", says="run_id"),
    case("slurm-extra-not-an-option", "launcher=slurm", "launcher.slurm.extra=['rm -rf /']", says="launcher.slurm.extra[0]"),
    case("mpi-export-not-a-name", "launcher=mpi", "topology=custom", "topology.hosts=[{name: a, devices: 1}, {name: b, devices: 1}]",
         "launcher.mpi.export=['A;B']", says="launcher.mpi.export[0]"),
    # recipes
    case("recipe-not-importable", "recipe=custom", "recipe.target=no_such_package.train:main", says="recipe.target"),
    case("recipe-not-a-target", "recipe=custom", "recipe.target='train my model'", says="recipe.target"),
    case("recipe-function-missing", "recipe=custom", "recipe.target=json:no_such_function", says="recipe.target"),  # (an importable module that imports no torch)
    case("recipe-target-missing", "recipe=custom", says="recipe.target"),
    case("script-missing", "recipe=script", "recipe.path=/no/such/train.py", says="recipe.path"),
    # init paths
    case("init-dir-missing", "init=file", "init.dir=/no/such/folder", says=("init.dir", "mkdir -p")),
    case("init-dir-relative", "init=file", "init.dir=rdzv", says="init.dir"),
    # conflicting options
    case("nccl-on-cpu", "backend=nccl", says="backend"),
    case("dp-on-several-hosts", "parallel=dp", "topology=2x2", "launcher=manual",
         "topology.hosts=[{name: a}, {name: b}]", says="parallel"),
    case("mpi-backend-without-mpi-launcher", "backend=mpi", says="backend.name"),
    case("several-hosts-locally", "topology=2x2", says="launcher.kind"),
    case("restarts-under-slurm", "launcher=slurm", "launcher.max_restarts=2", says=("launcher.max_restarts", "requeue")),
    case("loopback-master-two-hosts", "launcher=manual", "topology=custom", "topology.hosts=[{name: a, devices: 1}, {name: b, devices: 1}]",
         "init.master_addr=127.0.0.1", says="init.master_addr"),
    case("slurm-time-malformed", "launcher=slurm", "launcher.slurm.time=forever", says="launcher.slurm.time"),
    # syntax
    case("override-syntax", "topology.nodes=[1,", says="topology.nodes"),
    case("yaml-syntax-error", "--config-name=broken", says="broken", files={"broken.yaml": BROKEN_YAML}),
    case("job-file-unknown-key", "--config-name=extra", says="gpus_per_host", files={"extra.yaml": UNKNOWN_KEY_JOB}),
]



# through the real `run`: one of each way in which `run` itself, not validation, must refuse
CLI_IDS = ("nodes-not-a-number", "misspelt-key", "unknown-launcher", "override-syntax", "yaml-syntax-error",
           "job-file-unknown-key", "recipe-not-importable", "host-with-semicolon")
CLI = [c for c in CASES if c.id in CLI_IDS]
IN_PROCESS = [c for c in CASES if c.id not in CLI_IDS]
# the machine's answers asked in-process (runner.spec.probe.LocalProbe): whether torch has MPI is asked of torch itself
ASKS_TORCH = {"mpi-backend-without-mpi-launcher"}

# what `run` prints for a refusal: its own problems (``error: key: ...``), or Hydra's composition errors
REFUSED = re.compile(r"^(error: [\w.\[\]/+:-]+: |Error merging override |Could not |Could not override |In '|Key ')", re.M)


def refusal(c: Case, folder: Path) -> str:
    """What `run` says of ``c``'s arguments, found in-process as `run` finds it: the command line, Hydra's
    composition, the typed spec, then validation (the same functions, in the same order). Fails the test if they
    let the arguments through."""
    said = input_problems(list(c.args))
    if said:
        return "\n".join(said)
    try:
        cfg = compose_config(*c.args, "device=cpu")
    except (HydraException, OmegaConfBaseException) as e:  # `run` prints Hydra's message and exits 2
        return str(e)
    try:
        spec = typed_spec(cfg)
    except SpecRefused as e:
        return str(e)
    spec.workdir = str(folder)
    job, problems = validate(spec, LocalProbe(tried_once))  # each target tried once for all the cases
    assert job is None, f"{c.id}: {c.args} passed validation"
    return render_problems(problems)


@pytest.mark.parametrize("c", [pytest.param(c, id=c.id, marks=() if c.id in ASKS_TORCH else pytest.mark.unit)
                               for c in IN_PROCESS])
def test_bad_input_is_refused_before_anything_starts(c: Case, tmp_path) -> None:
    said = refusal(c, tmp_path)
    assert REFUSED.search(said), said
    for fragment in c.fragments:
        assert fragment in said, said
    assert "Traceback" not in said, said


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path, str]]:
    """Every CLI case run once, four at a time: id -> (result, its folder, its run id)."""
    folders = {c.id: tmp_path_factory.mktemp(c.id) for c in CLI}  # (mktemp is not thread-safe)

    def one(c: Case):
        folder = folders[c.id]
        run_id = f"bad-{uuid.uuid4().hex[:10]}"
        args = [RUN]
        if c.files:
            conf = folder / "conf"
            conf.mkdir()
            for name, text in c.files:
                (conf / name).write_text(text)
            args.append(f"--config-dir={conf}")
        args += [*c.args, "device=cpu"]  # the default recipe (digits) unless the case says
        if not any(a.startswith("run_id=") for a in c.args):
            args.append(f"run_id={run_id}")
        result = subprocess.run(args, cwd=folder, env=user_env(), capture_output=True, text=True, timeout=120)
        return c.id, (result, folder, run_id)

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(pool.map(one, CLI))


@pytest.mark.parametrize("c", CLI, ids=[c.id for c in CLI])
def test_bad_input_through_run_is_refused_clearly_and_starts_nothing(outcomes, c: Case):
    result, folder, run_id = outcomes[c.id]
    shown = f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    assert result.returncode == 2, shown
    assert REFUSED.search(result.stderr), shown
    for fragment in c.fragments:
        assert fragment in result.stderr, shown
    assert "Traceback" not in result.stdout + result.stderr, shown
    started = [p for p in (folder / "outputs").rglob("*") if p.name in ("plan.json", "launch.txt", "logs")]
    assert not started, started
    nothing_left(run_id)


@pytest.mark.unit
def test_the_readme_counts_the_cases_as_they_are() -> None:
    assert len({c.id for c in CASES}) == len(CASES)
    assert set(CLI_IDS) <= {c.id for c in CASES}
    said = re.search(r"`tests/app/test_bad_input\.py` checks (\d+) such cases, (\d+) of them through the real `run`",
                     docs().text.replace("\n", " "))
    assert said is not None
    assert (int(said[1]), int(said[2])) == (len(CASES), len(CLI))
