"""The tables (and table-like lists) of README.md and docs/ that mirror the code hold what the code holds: the config groups and
their options, the keys of launcher=ssh, the variables each process gets, what the dry run shows of them, the exit
statuses, the sharding modes, the launchers that restart and those that refuse to outlive a host, the scheduler variables read, the layers of the Layout and
what runner.api offers."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import re
import signal
import tomllib

import pytest

from conftest import REPO, compose, config_groups, validate
from readme_text import code_of, docs
from runner.common import exits
from runner.environments import mpi, slurm
from runner.environments.child import child_environment
from runner.environments.process import ProcessEnvironment
from runner.launchers import LAUNCHERS
from runner.launchers import plan_for
from runner.records.paths import RunPaths
from runner.plan.render import SHOWN_ENV, plan_table
from runner.spec.schema import BackendName, ParallelMode, ShardingMode, SshOptions, TaskMode
from runner.training.sharding import _STRATEGIES

pytestmark = pytest.mark.docs

# --------------------------------------------------------------------------- config groups


def _options(cell: str) -> list[str]:
    """The options a cell lists first, in inline code: `1x1 1x2 ...`."""
    return code_of(cell)[0].split()


def _group_table() -> dict[str, list[str]]:
    table = docs().table("group", "options", "decides")
    return {code_of(row[0])[0]: _options(row[1]) for row in table.rows}


# options the table leaves out on purpose: option -> why
NOT_OFFERED = {("sharding", "fairscale_fsdp"): "refused by validation, pointing to fsdp (README: What is checked)"}


def test_the_group_table_is_confs_folders_and_files() -> None:
    import importlib.resources

    shipped = {group: sorted(p.name.removesuffix(".yaml") for p in importlib.resources.files("runner.conf").joinpath(group)
                             .iterdir() if p.name.endswith(".yaml") and (group, p.name[:-5]) not in NOT_OFFERED)
               for group in config_groups()}
    assert {g: sorted(o) for g, o in _group_table().items()} == shipped
    for group, option in NOT_OFFERED:
        assert f"{group}={option}" in docs().text


def test_the_group_tables_choices_are_the_schemas() -> None:
    table = _group_table()
    assert sorted(table["launcher"]) == sorted(LAUNCHERS)
    assert table["backend"] == [b.value for b in BackendName]
    assert table["parallel"] == [p.value for p in ParallelMode]
    assert table["sharding"] == [m.value for m in _STRATEGIES] == [m.value for m in ShardingMode
                                                                   if ("sharding", m.value) not in NOT_OFFERED]
    [launcher_row] = [r for r in docs().table("group", "options", "decides").rows if r[0] == "`launcher`"]
    assert re.findall(r"`(?:launcher\.tasks=)?(\w+)`", launcher_row[2]) == [t.value for t in TaskMode]


def test_any_nxm_is_a_topology() -> None:
    """"and **any `NxM`** (`topology=3x4`)": the example composes to 3 hosts of 4 devices."""
    [row] = [r for r in docs().table("group", "options", "decides").rows if r[0] == "`topology`"]
    example = re.search(r"\*\*any `NxM`\*\* \(`(topology=(\d+)x(\d+))`\)", row[1])
    assert example is not None, row[1]
    spec = compose(example[1])
    assert (spec.topology.nodes, spec.topology.devices_per_node) == (int(example[2]), int(example[3]))


def test_the_sharding_table_has_every_mode() -> None:
    modes = [code_of(row[0])[0] for row in docs().table("mode", "what each process keeps a 1/world-size share of",
                                                          "gradients exchanged by", "library").rows]
    assert modes == [m.value for m in _STRATEGIES]


def test_the_restart_table_has_every_launcher() -> None:
    rows = docs().table("launcher", "what restarts", "how", "state resumes from").rows
    assert [code_of(r[0])[0] for r in rows] == list(LAUNCHERS)


def test_the_lost_host_table_is_every_launcher_that_refuses_with_its_reason() -> None:
    """"When a host is lost": the launchers that cannot go on without a host, each with the reason validation gives."""
    rows = docs().table("launcher", "why a lost host ends its job").rows
    assert {code_of(r[0])[0]: r[1] for r in rows} == {
        name: launcher.capabilities.lost_host_reason for name, launcher in LAUNCHERS.items()
        if not launcher.capabilities.survives_lost_hosts}


def test_the_ssh_key_table_has_every_key_of_the_schema() -> None:
    """A row names a key and, bare, its siblings (`launcher.ssh.user`, `port`, `identity_file`): together every key of
    launcher.ssh, each once."""
    named = []
    for row in docs().table("key", "what").rows:
        first, *siblings = code_of(row[0])
        parent = first.rsplit(".", 1)[0]
        named += [first, *(f"{parent}.{s}" for s in siblings)]
    assert sorted(named) == sorted(f"launcher.ssh.{f.name}" for f in dataclasses.fields(SshOptions))


# --------------------------------------------------------------------------- what each process gets

# Variables a rank gets that the table of torchrun's environment leaves to another part of the README: name -> where.
ELSEWHERE = {"TORCH_FR_BUFFER_SIZE": "Differences from torchrun",  # not torchrun's: a row of the differences
             "GLOO_SOCKET_IFNAME": "Networks", "NCCL_SOCKET_IFNAME": "Networks"}


def _two_host_environments(tmp_path) -> tuple[dict[str, str], object]:
    """The environment of rank 3 (host 1) of a 2x2 GPU job across two named hosts, as the launch builds it."""
    got = validate(["topology=2x2", "launcher=manual", "device=cuda", "init=tcp", "topology.hosts=[{name: a}, {name: b}]",
                    "topology.nodes=null", "topology.devices_per_node=2", "launcher.max_restarts=3"], cuda_devices=2)
    assert got.valid, got.rendered()
    paths = RunPaths(tmp_path, "r1", attempt=1)
    plan = plan_for(got.job, paths)
    env = child_environment(plan, plan.records[3], paths, ProcessEnvironment.read({}), master_port="29500",
                            agent_store=True, network={"GLOO_SOCKET_IFNAME": "lan0", "NCCL_SOCKET_IFNAME": "lan0"})
    return env, plan


def _variable_table() -> dict[str, str]:
    table = docs().table("variable", "value")
    assert table.section == "Unchanged torchrun-style scripts"
    return {name: row[1] for row in table.rows for name in code_of(row[0])}


def test_the_variable_table_names_every_variable_a_rank_gets(tmp_path) -> None:
    """"Each process gets torchrun's environment": exactly the variables the launch sets for a rank (GPU job, two
    hosts), but those another part of the README describes."""
    env, _ = _two_host_environments(tmp_path)
    assert "GROUP_WORLD_SIZE" in env
    assert set(_variable_table()) == set(env) - set(ELSEWHERE)
    for name, section in ELSEWHERE.items():
        assert name in docs().section(section), f"{name}: README's {section} no longer says it"


def test_the_variable_tables_literal_values_are_a_ranks(tmp_path) -> None:
    """A value given as a literal (`default`, `True`, `1`) is the rank's; `launcher.max_restarts` is the spec's."""
    env, plan = _two_host_environments(tmp_path)
    checked = 0
    for name, cell in _variable_table().items():
        first = (code_of(cell) or [""])[0]
        if first == "launcher.max_restarts":
            assert env[name] == str(plan.job.spec.launcher.max_restarts) == "3"
        elif cell.startswith("`") and re.fullmatch(r"\w+", first):
            assert env[name] == first, (name, env[name], cell)
        else:
            continue
        checked += 1
    assert checked >= 4
    assert (env["GROUP_WORLD_SIZE"], env["TORCHELASTIC_RESTART_COUNT"]) == ("2", "1")  # hosts; restarts so far


def test_the_dry_run_shows_the_variables_the_readme_lists() -> None:
    """The dry run's plan rows: the variables listed, and the placeholders of what only the launch knows."""
    section = " ".join(docs().section("The dry run").split())
    listed = re.search(r"the environment it gets \(([A-Z_, ]+) on GPUs(?:, ([A-Z_]+) [^)]*)?\)", section)
    assert listed is not None
    names = listed[1].split(", ") + ([listed[2]] if listed[2] else [])
    assert names == list(SHOWN_ENV)
    placeholders = re.findall(r"`(<[^>]+>)`", section.split("values only the launch can know are shown as", 1)[1])[:2]
    local = validate(["topology=1x2", "device=cpu"])
    batch = validate(["topology=2x2", "launcher=slurm", "device=cpu"])
    rendered = plan_table(plan_for(local.job)) + plan_table(plan_for(batch.job))
    assert placeholders and all(p in rendered for p in placeholders), (placeholders, rendered)


# --------------------------------------------------------------------------- exit statuses


def test_the_exit_statuses_are_runner_common_exits() -> None:
    section = " ".join(docs().section("Exit status").split())
    said = dict(re.findall(r"`(\d+)` (success|invalid spec|a rank failed)", section))
    assert said == {str(exits.OK): "success", str(exits.INVALID): "invalid spec", str(exits.FAILED): "a rank failed"}
    base = re.search(r"`(\d+)\+n` stopped by signal `n`", section)
    assert base and exits.from_signal(signal.SIGTERM) == int(base[1]) + signal.SIGTERM
    constants = {n for n, v in vars(exits).items() if n.isupper() and isinstance(v, int)}
    assert constants == {"OK", "FAILED", "INVALID"}, "a new exit status: add it to README's Exit status"


# --------------------------------------------------------------------------- scheduler variables


def test_every_scheduler_variable_the_readme_names_is_read_there() -> None:
    """`SLURM_PROCID` ... "in `runner/environments/slurm.py`"; `OMPI_COMM_WORLD_*` ... "in `runner/environments/mpi.py`"."""
    text = docs().text
    declared_mpi = [v for names in mpi.VARIABLES.values() for v in names]
    # SLURM_CONF: the test bed's, for sinfo; SLURM_HOSTFILE: set by the batch script for srun, not read
    slurm_named = set(re.findall(r"\bSLURM_[A-Z_]+\b", text)) - {"SLURM_CONF", "SLURM_HOSTFILE"}
    assert slurm_named and slurm_named <= set(slurm.VARIABLES), slurm_named - set(slurm.VARIABLES)
    assert "export SLURM_HOSTFILE=" in (REPO / "runner" / "launchers" / "slurm" / "step.py").read_text()
    mpi_named = re.findall(r"\b(?:OMPI|MV2|PMI|MPI)_[A-Z_]+\*?", text)
    assert len(mpi_named) >= 5
    for name in mpi_named:
        assert any(v == name or (name.endswith("*") and v.startswith(name[:-1])) for v in declared_mpi), name


# --------------------------------------------------------------------------- layout


def _layout() -> list[tuple[list[str], str]]:
    """The Layout block: (its layer's packages, as import-linter names them; the description)."""
    [block] = [b for b in docs().blocks if b.section == "Layout"]
    layers: list[tuple[list[str], str]] = []
    for line in block.lines:
        if line.startswith("runner/"):
            folders = re.findall(r"runner/[\w.]+", line)
            rest = line[line.rindex(folders[-1]) + len(folders[-1]):].lstrip("/ ")
            layers.append(([f.replace("/", ".").removesuffix(".py") for f in folders], rest))
        else:
            layers[-1] = (layers[-1][0], f"{layers[-1][1]} {line.strip()}")
    return layers


def test_the_layout_is_the_import_contracts_layers() -> None:
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    [layers] = [c["layers"] for c in contracts if c["type"] == "layers"]
    assert [sorted(packages) for packages, _ in _layout()] == [sorted(layer.split(" | ")) for layer in layers]
    shipped = {m.name for m in pkgutil.iter_modules(importlib.import_module("runner").__path__)}
    assert {p.split(".")[1] for packages, _ in _layout() for p in packages} == shipped


@pytest.mark.parametrize("package", ["runner.launchers", "runner.plan", "runner.spec", "runner.records"])
def test_the_layout_names_every_module_of_the_layers_it_lists(package: str) -> None:
    """The lines that list a package's modules by name name all of them (the base class is the package's own); a
    layer of siblings describes each after its name (``spec: ...; records: ...``)."""
    [description] = [d for packages, d in _layout() if package in packages]
    name = package.rsplit(".", 1)[1]
    if f"{name}:" in description:
        description = description.split(f"{name}:", 1)[1].split(";")[0]
    modules = {m.name for m in pkgutil.iter_modules(importlib.import_module(package).__path__)} - {"base"}
    assert not {m for m in modules if not re.search(rf"\b{m}\b", description)}, description


def test_the_readme_lists_what_runner_api_offers() -> None:
    """Recipes: "`runner.api` is the stable API ...: `RunContext`, `Progress`, the `Recipe` protocol and
    `single_process_context`"; Layout: "api: what recipes use (RunContext, ...)": runner.api.__all__, both."""
    offered = sorted(importlib.import_module("runner.api").__all__)
    recipes = re.search(r"is the stable API for training code\*\*: (.+?) \(a context", " ".join(docs().text.split()))
    assert recipes is not None
    assert sorted(code_of(recipes[1])) == offered
    [description] = [d for packages, d in _layout() if "runner.api" in packages]
    listed = re.search(r"api: what recipes use \(([^)]+)\)", description)
    assert listed is not None, description
    assert sorted(listed[1].split(", ")) == offered


# --------------------------------------------------------------------------- measured figures


def sharding_rows() -> list[tuple[str, ...]]:
    """The rows of the README's sharding measurements, from benchmarks/results/sharding_memory.json (each figure the
    largest over the ranks, as the benchmark records it per mode, and its ratio against `none`)."""
    import json

    data = json.loads((REPO / "benchmarks" / "results" / "sharding_memory.json").read_text())
    rows = []
    for shape, result in data["results"].items():
        for mode, m in result["modes"].items():
            ratio = m["ratio_vs_none"]
            rows.append((shape, mode, f"{m['optimizer_state_bytes'] / 2**20:.2f} MiB ({ratio['optimizer_state_bytes']:.2f}x)",
                         f"{m['peak_bytes'] / 2**20:.1f} MiB ({ratio['peak_bytes']:.2f}x)",
                         f"{m['step_s'] * 1000:.1f} ms ({ratio['step_s']:.2f}x)"))
    return rows


def test_the_sharding_measurements_are_the_committed_results() -> None:
    table = docs().table("shape", "mode", "optimizer state / process", "peak tensor memory / process", "step time")
    assert list(table.rows) == sharding_rows()


def test_the_readmes_table_of_guarantees_is_the_launchers_and_the_floor_of_the_jobs_own_etcd() -> None:
    """README, "When a host is lost": a row for each launcher that goes on without a lost host, and none for the
    others; the floor of the job's own etcd is a majority of its members (runner.launchers.elastic.etcd_member)."""
    from runner.launchers import LAUNCHERS
    from runner.launchers.elastic.etcd_member import OwnCluster

    table = docs().table("launcher", "who decides who goes on", "can the job split in two?",
                           "the fewest hosts it goes on with", "the checkpoint resumed")
    rows = {row[0].strip("`"): row for row in table.rows}
    assert set(rows) == {name for name, cls in LAUNCHERS.items() if cls.capabilities.survives_lost_hosts}
    assert all(row[2].startswith("no:") for row in rows.values())
    assert "n // 2 + 1 of its n hosts and spares" in rows["manual"][3]
    assert [OwnCluster(names=("x",) * n, addrs=(), client_port=0, peer_port=0, token="").floor
            for n in (1, 2, 3, 4, 5)] == [n // 2 + 1 for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]
