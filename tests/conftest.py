"""Shared helpers for the tests of the spec / validation / plan / dry-run layer.

* :func:`compose` builds a typed :class:`~runner.spec.schema.JobConfig` from Hydra overrides exactly as
  `run` does (same config module, same schemas and resolvers), through Hydra's compose API.
* :func:`validate` runs :func:`runner.spec.validation.validate` against a :class:`~runner.spec.probe.FixedProbe`
  and returns everything a test wants to look at (job, problems by severity, the probe and what it
  was asked).
* :func:`make_spec` builds a JobConfig straight from the dataclasses (no Hydra: fast, for property
  tests and benchmarks).
* The autouse fixture ``no_env_leaks`` fails any test that leaves ``os.environ`` changed; a test marked ``unit``
  fails if it starts a Python interpreter or imports torch, and a session of unit tests alone imports only the
  modules that mark tests unit (and stops if collecting them imported torch).
* ``closed_port`` and ``listening_port``: a port of 127.0.0.1 that refuses connections, and one that takes them.
"""

from __future__ import annotations

import functools
import gc
import importlib.resources
import importlib.util
import os
import pickle
import shutil
import socket
import subprocess
import sys
import traceback
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pytest
from hydra import compose as _hydra_compose
from hydra import initialize_config_module
from hydra._internal.config_loader_impl import ConfigLoaderImpl  # Hydra's own way of setting keys: its errors too
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from omegaconf import DictConfig, OmegaConf

import runner.app.cli
from runner.app.topology_shapes import parse_shape
from runner.environments.process import ProcessEnvironment
from runner.records.paths import RunPaths
from runner.spec.job import Job
from runner.spec.probe import FixedProbe, try_early
from runner.spec.problems import Problem, Severity
from runner.spec.schema import (
    BackendConfig,
    DeviceKind,
    HostConfig,
    InitConfig,
    JobConfig,
    LauncherConfig,
    ParallelConfig,
    ParallelMode,
    RecipeConfig,
    ShardingConfig,
    TaskMode,
    TopologyConfig,
)
from runner.launchers import validate as validate_spec

pytest_plugins = ["pytester", "testbed_fixtures", "scheduling"]

# pytest rewrites the asserts of every test module it imports (about 3 s of CPU for the suite, in every xdist worker)
# and keeps the result in __pycache__, unless the machine turns bytecode writing off (PYTHONDONTWRITEBYTECODE, as
# CI's machines do): the suite's own modules are kept whatever it says. What the tests start (`run`, its ranks)
# gets the environment as it is.
sys.dont_write_bytecode = False

REPO = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).resolve().parent / "golden"

# An importable recipe target that is always there: the dry-run layer is tested apart from the recipes.
TARGET = "runner.recipes.digits:main"  # a real recipe: validation checks the function exists


@pytest.fixture(scope="module")
def zygote():
    """A host's zygote (runner.worker.zygote: the fresh interpreter the ranks and host 0's store are forked from), one
    for a test module, as an agent keeps one for all its attempts."""
    from runner.worker.zygote import Zygote

    started = Zygote.start()
    yield started
    started.close()


# --------------------------------------------------------------------------- composing specs


@functools.cache
def config_groups() -> frozenset[str]:
    """The config groups of runner.conf (topology, init, launcher, ...), as installed."""
    return frozenset(p.name for p in importlib.resources.files("runner.conf").iterdir() if p.is_dir()
                     and not p.name.startswith("_"))


def hydra_compose(*overrides: str) -> DictConfig:
    """The config `run <overrides>` composes, by Hydra's compose API (pkg://runner.conf, `job`)."""
    runner.app.cli.register(overrides)  # schemas and topology=NxM shapes in the ConfigStore, the resolvers
    with initialize_config_module(config_module="runner.conf", version_base=None):
        return _hydra_compose(config_name="job", overrides=list(overrides))


@functools.cache
def _group_node(choice: str) -> DictConfig:
    """What ``group=option`` composes under its group, each option once: what Hydra makes of the option's defaults
    list where it is the one shape runner.conf's options have (the group's schema ``@_here_``, then ``_self_``: the
    schema's node merged with the file's keys; a file without defaults: its keys; a ``topology=NxM`` shape: its node
    in the ConfigStore), a thirtieth of a Hydra composition's time; any other option composed by Hydra.
    test_fixtures.py: the same as Hydra's, option by option and for combinations."""
    group, option = choice.split("=", 1)
    if not _is_option(group, option):
        return hydra_compose(choice)[group]  # not an option of the group: Hydra's own refusal
    runner.app.cli.register((choice,))  # the schemas, topology=NxM shapes
    file = importlib.resources.files("runner.conf").joinpath(group, f"{option}.yaml")
    if not file.is_file():
        return ConfigStore.instance().load(f"{group}/{option}.yaml").node
    keys = OmegaConf.create(file.read_text())
    defaults = keys.pop("defaults", None)
    if defaults is None:
        return keys
    schema, *rest = defaults
    if rest != ["_self_"] or not (schema.startswith("/schema/") and schema.endswith(HERE)):
        with initialize_config_module(config_module="runner.conf", version_base=None):
            return _hydra_compose(config_name=f"{group}/{option}")[group]
    return OmegaConf.merge(ConfigStore.instance().load(f"{schema[1:-len(HERE)]}.yaml").node, keys)


HERE = "@_here_"


def _is_option(group: str, option: str) -> bool:
    return importlib.resources.files("runner.conf").joinpath(group, f"{option}.yaml").is_file() or (
        group == "topology" and parse_shape(option) is not None)


@functools.cache
def _composed_groups(choices: tuple[str, ...]) -> DictConfig:
    """What Hydra composes for these group choices alone. Every option of runner.conf fills its own group's
    package and nothing else (its schema @_here_, then itself), so a combination is the defaults' config with
    each chosen group's node as that option composes it: one composition per option, not per combination
    (test_fixtures.py: the same as Hydra's, option by option and for combinations)."""
    cfg = _copy(_defaults())
    for choice in choices:
        cfg[choice.split("=", 1)[0]] = _copy(_group_node(choice))
    return cfg


def _copy(cfg: DictConfig) -> DictConfig:
    """A deep copy of a composed config: through pickle, a third of ``copy.deepcopy``'s time on OmegaConf's nodes
    (the same nodes, flags and types: the tests compare the two in test_fixtures.py)."""
    return pickle.loads(pickle.dumps(cfg))


@functools.cache
def _defaults() -> DictConfig:
    return hydra_compose()


def compose_config(*overrides: str) -> DictConfig:
    """The config `run <overrides>` composes (what :func:`hydra_compose` gives), made faster: Hydra composes each
    group option once (a defaults list is most of a composition's time, see _composed_groups), then Hydra's own
    code sets the plain keys on a copy, as it does after the defaults, with its own errors
    (test_fixtures.py: the same config as a full composition, and the same refusals)."""
    groups = config_groups()
    choices = tuple(o for o in overrides if o.split("=", 1)[0] in groups)
    keys = [o for o in overrides if o.split("=", 1)[0] not in groups]
    cfg = _copy(_composed_groups(choices))
    if keys:
        ConfigLoaderImpl._apply_overrides_to_config([_parsed(key) for key in keys], cfg)
    return cfg


@functools.cache
def _parsed(override: str) -> Override:
    """One ``key=value`` as Hydra's override parser reads it, each once (a quarter of the unit tests' composing was
    parsing the same overrides again); setting a key only reads the parsed override (its value is copied into
    the config's nodes)."""
    (parsed,) = OverridesParser.create().parse_overrides([override])
    return parsed


def compose(*overrides: str) -> JobConfig:
    """The typed spec `run <overrides>` would get (:func:`compose_config`, as the schema's dataclasses)."""
    if not any(o.split("=", 1)[0] not in config_groups() for o in overrides):
        # no key to set: the cached config is not changed, and to_object makes new objects
        return OmegaConf.to_object(_composed_groups(tuple(overrides)))
    return OmegaConf.to_object(compose_config(*overrides))


def hosts_override(*hosts: Mapping[str, object] | str) -> tuple[str, ...]:
    """Overrides that replace the topology by an explicit host list.

    Each host is a mapping (``{"name": "a", "devices": 2}``) or a ready flow-style string
    (``"{name: 'a;b', devices: 1}"``). ``topology.nodes`` and ``devices_per_node`` are cleared so
    that the shape of whatever topology option was chosen does not interfere.
    """
    items = []
    for h in hosts:
        if isinstance(h, str):
            items.append(h)
            continue
        parts = []
        for k, v in h.items():
            if isinstance(v, str):
                parts.append(f"{k}: '{v}'")
            elif isinstance(v, (list, tuple)):
                parts.append(f"{k}: [{', '.join(map(str, v))}]")
            elif v is None:
                parts.append(f"{k}: null")
            else:
                parts.append(f"{k}: {v}")
        items.append("{" + ", ".join(parts) + "}")
    return ("topology.nodes=null", "topology.devices_per_node=null", f"topology.hosts=[{', '.join(items)}]")


def make_spec(
    *,
    devices: Iterable[int] | None = None,
    names: Iterable[str | None] | None = None,
    addrs: Iterable[str | None] | None = None,
    gpus: Iterable[list[int] | None] | None = None,
    nodes: int | None = None,
    devices_per_node: int | None = None,
    launcher: str = "local",
    tasks: TaskMode | str = TaskMode.per_host,
    device: DeviceKind | str = DeviceKind.cpu,
    parallel: ParallelMode | str = ParallelMode.ddp,
    global_batch_size: int | None = None,
    init: InitConfig | None = None,
    backend: BackendConfig | None = None,
    target: str = TARGET,
) -> JobConfig:
    """A JobConfig from the dataclasses: grid (nodes x devices_per_node) or one host per ``devices`` entry.

    ``global_batch_size`` None: the world size times 4 (always divisible).
    """
    if devices is not None:
        devices = list(devices)
        n = len(devices)
        names = list(names) if names is not None else [None] * n
        addrs = list(addrs) if addrs is not None else [None] * n
        gpus = list(gpus) if gpus is not None else [None] * n
        hosts = [HostConfig(name=nm, addr=ad, devices=d, gpus=g) for nm, ad, d, g in zip(names, addrs, devices, gpus)]
        topology = TopologyConfig(nodes=None, devices_per_node=devices_per_node, hosts=hosts)
        world = sum(devices)
        n_hosts = n
    else:
        topology = TopologyConfig(nodes=nodes, devices_per_node=devices_per_node, hosts=None)
        world = (nodes or 0) * (devices_per_node or 0)
        n_hosts = nodes or 0
    parallel = ParallelMode(parallel)
    if parallel is ParallelMode.dp:
        world = n_hosts
    if global_batch_size is None:
        global_batch_size = max(world, 1) * 4
    return JobConfig(
        topology=topology,
        init=init or InitConfig(),
        launcher=LauncherConfig(kind=str(launcher), tasks=TaskMode(tasks)),
        backend=backend or BackendConfig(),
        parallel=ParallelConfig(mode=parallel),
        sharding=ShardingConfig(),
        recipe=RecipeConfig(target=target, global_batch_size=global_batch_size),
        device=DeviceKind(device),
    )


# --------------------------------------------------------------------------- validating specs


@dataclass
class Checked:
    """What `validate(spec, probe)` said, sorted for assertions."""

    spec: JobConfig
    job: Job | None
    problems: list[Problem]
    probe: FixedProbe = field(repr=False)

    @property
    def valid(self) -> bool:
        return self.job is not None

    def of(self, severity: Severity) -> list[Problem]:
        return [p for p in self.problems if p.severity is severity]

    @property
    def errors(self) -> list[Problem]:
        return self.of(Severity.error)

    @property
    def warnings(self) -> list[Problem]:
        return self.of(Severity.warning)

    @property
    def notices(self) -> list[Problem]:
        return self.of(Severity.notice)

    def find(self, key: str, fragment: str = "", severity: Severity | None = None) -> Problem | None:
        """The first problem with exactly this key whose message or hint contains ``fragment``."""
        for p in self.problems:
            if p.key == key and fragment in f"{p.message}\n{p.hint}" and (severity is None or p.severity is severity):
                return p
        return None

    def rendered(self) -> str:
        return "\n".join(p.render() for p in self.problems) or "(no problems)"


def validate(spec: JobConfig | Iterable[str], probe: FixedProbe | None = None, **probe_kwargs) -> Checked:
    """`runner.launchers.validate(spec, FixedProbe(**probe_kwargs))`; ``spec`` may be a JobConfig or Hydra overrides."""
    if not isinstance(spec, JobConfig):
        spec = compose(*spec)
    if probe is None:
        probe = FixedProbe(**probe_kwargs)
    elif probe_kwargs:
        raise TypeError("give either a probe or probe keyword arguments")
    job, problems = validate_spec(spec, probe)
    return Checked(spec, job, problems, probe)


# --------------------------------------------------------------------------- files as modules


def load_module(name: str, path: Path) -> ModuleType:
    """The Python file ``path`` imported as module ``name`` (the benchmarks and their workloads are scripts, not a
    package the tests can import)."""
    found = importlib.util.spec_from_file_location(name, path)
    assert found is not None and found.loader is not None, path
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- subprocess helpers


def environment(**variables: str) -> ProcessEnvironment:
    """A process environment with exactly these variables (runner.environments.process), e.g. SLURM_JOB_ID
    for `run` inside an allocation."""
    return ProcessEnvironment.read(variables)


# --------------------------------------------------------------------------- hooks


class _FirstImport:
    """Which file of the tests or the runner first imported ``name``, found as the import system first looks for it
    (this finder finds nothing: it only notes who asked)."""

    def __init__(self, name: str) -> None:
        self.name, self.asked_by = name, ""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        if fullname == self.name and not self.asked_by:
            ours = [f for f in traceback.extract_stack() if str(REPO) in f.filename and f.filename != __file__]
            self.asked_by = f"{ours[-1].filename}:{ours[-1].lineno}" if ours else "?"
        return None

    def by(self) -> str:
        return f"first imported at {self.asked_by}" if self.asked_by else "imported before the tests' conftest"


FIRST_TORCH_IMPORT = _FirstImport("torch")
sys.meta_path.insert(0, FIRST_TORCH_IMPORT)


def pytest_sessionstart(session: pytest.Session) -> None:
    """The bundled recipe's trial, which validation asks of nearly every spec a test validates (FixedProbe and
    runner.spec.probe.tried_once: once for the session), starts now: its child imports torch beside collection, and
    the session itself imports none (pytest -m unit). An xdist controller runs no test: none there."""
    if session.config.getoption("numprocesses", None) and not hasattr(session.config, "workerinput"):
        return
    try_early(TARGET)


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection left (the runner, torch and Hydra imported, every test module) is kept out of the garbage
    collector's passes (``gc.freeze``): each full pass, pytest's own at its end among them, then walks only what the
    tests made (half a second a pass otherwise, with torch imported).

    A session of unit tests alone (pytest -m unit) must not have imported torch while collecting (every test module
    is imported, whatever its marks: a module imports torch in the tests that use it, not at its top)."""
    if "torch" in sys.modules and session.items and all(item.get_closest_marker("unit") for item in session.items):
        pytest.exit(f"collecting the unit tests imported torch ({FIRST_TORCH_IMPORT.by()}): import it in the tests "
                    "that use it, which are not marked unit", returncode=pytest.ExitCode.USAGE_ERROR)
    gc.freeze()


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """... and so is what each test leaves (the parsed sources, composed configs and caches the next tests reuse, and
    its garbage: some 70 MB more over pytest -m unit): the automatic full passes walked it again and again, 1.3 s of
    pytest -m unit's 10 in ten passes, 0.1 s so."""
    gc.freeze()


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """A session of marked tests alone (``-m unit``, ``-m "unit or docs"``) does not import a test module that marks no
    test so (its text names no ``mark.unit``, ``mark.docs``): pytest would import it to deselect every test of it, and
    the end-to-end modules import torch, the training code's tests too (what pytest -m unit's time rests on)."""
    marks = only_marks(config.option.markexpr)
    if not marks or not (collection_path.name.startswith("test_") and collection_path.suffix == ".py"):
        return None
    text = collection_path.read_text()
    return None if any(f"mark.{mark}" in text for mark in marks) else True


def only_marks(expression: str) -> frozenset[str]:
    """The marks of a ``-m`` expression that selects tests by their marks alone (``unit``, ``unit or docs``); none for
    any other (``not testbed``, ``unit and not slow``, none given)."""
    names = frozenset(word.strip() for word in (expression or "").split(" or "))
    return names if all(name.isidentifier() and name not in ("not", "and", "or") for name in names) else frozenset()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses the namespace hosts or the Slurm cluster is marked so (pytest -m "not testbed")."""
    for item in items:
        if "testbed" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.testbed)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def paths(tmp_path) -> RunPaths:
    """A run's folder, made, in the test's temporary folder."""
    paths = RunPaths(tmp_path, "r1")
    paths.make()
    return paths


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port of 127.0.0.1 nobody listens on (held bound, so no one else takes it meanwhile): connections are
    refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@pytest.fixture
def listening_port() -> Iterator[int]:
    """A port of 127.0.0.1 that listens (nothing accepts: a connection opens in its queue)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s.getsockname()[1]


@pytest.fixture(scope="module")
def optimizers_imported():
    """Building a torch optimizer the first time imports torch._dynamo, which sets TORCHINDUCTOR_CACHE_DIR.

    Do that once before a module's tests (so no test is blamed for an environment leak) and put the environment
    back after them: ``pytestmark = pytest.mark.usefixtures("optimizers_imported")``.
    """
    import torch

    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    torch.optim.Adam(torch.nn.Linear(1, 1).parameters())
    yield
    if before is None:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)


def environ_changes(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    """Human-readable differences between two environment snapshots (empty: none)."""
    changes = []
    for k in sorted(after.keys() - before.keys()):
        changes.append(f"added {k}={after[k]!r}")
    for k in sorted(before.keys() - after.keys()):
        changes.append(f"removed {k} (was {before[k]!r})")
    for k in sorted(before.keys() & after.keys()):
        if before[k] != after[k]:
            changes.append(f"changed {k}: {before[k]!r} -> {after[k]!r}")
    return changes


# set and updated by pytest itself around every phase of a test
_PYTEST_OWN = frozenset({"PYTEST_CURRENT_TEST"})


@pytest.fixture(autouse=True)
def no_env_leaks():
    """Fail a test that leaves os.environ different from how it found it (then put it back)."""
    before = {k: v for k, v in os.environ.items() if k not in _PYTEST_OWN}
    yield
    after = {k: v for k, v in os.environ.items() if k not in _PYTEST_OWN}
    changes = environ_changes(before, after)
    if changes:
        for k in after.keys() - before.keys():
            del os.environ[k]
        os.environ.update(before)
        pytest.fail("the test leaked environment variables:\n  " + "\n  ".join(changes), pytrace=False)


@pytest.fixture(autouse=True)
def unit_tests_start_no_interpreter(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test marked ``unit`` (or ``docs``) starts no Python interpreter (pyproject's markers: each one pays for its
    imports, torch's most of all, which is what ``pytest -m unit``'s speed rests on); a quick program such as git or
    ``ssh -G`` is allowed, and so is a fork (the probe tries a recipe's import in one)."""
    if not any(request.node.get_closest_marker(name) for name in ("unit", "docs")):
        yield
        return
    execute = subprocess.Popen._execute_child  # type: ignore[attr-defined]

    def checked(self: subprocess.Popen, args: object, executable: object, *rest: object) -> None:
        argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)  # type: ignore[call-overload]
        program = os.fsdecode(executable or argv[0])
        found = shutil.which(program) or program
        if Path(program).name.startswith("python") or Path(found).parent == Path(sys.executable).parent:
            raise AssertionError(f"a test marked unit started a Python interpreter ({program}): mark it otherwise "
                                 "(pyproject.toml, markers)")
        execute(self, args, executable, *rest)

    torch_before = "torch" in sys.modules
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "_execute_child", checked)
        yield
    if not torch_before and "torch" in sys.modules:
        pytest.fail(f"a test marked unit imported torch ({FIRST_TORCH_IMPORT.by()}): mark it otherwise (pyproject.toml, "
                    "markers)", pytrace=False)
