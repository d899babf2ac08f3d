"""The typed schema of a job spec.

Every YAML option under ``conf/`` is merged onto one of these dataclasses (registered in Hydra's
ConfigStore by :func:`register_schemas`), so a misspelt key, a wrong type or an unknown choice fails
at composition time with Hydra's message naming the key. Rules that span several keys live in
:mod:`runner.spec.validation`, not here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


class InitMethod(str, Enum):
    """How processes rendezvous."""

    env = "env"  # MASTER_ADDR / MASTER_PORT in each process's environment (env://)
    tcp = "tcp"  # tcp://MASTER_ADDR:MASTER_PORT
    file = "file"  # file:///a/path/every/host/sees, fresh per run


class TaskMode(str, Enum):
    """What one task of the launcher is."""

    per_host = "per_host"  # one task per host that spawns that host's processes (multiprocessing)
    per_device = "per_device"  # one task per process, started by the launcher itself


class BackendName(str, Enum):
    auto = "auto"  # nccl when the devices are CUDA GPUs, gloo otherwise
    nccl = "nccl"
    gloo = "gloo"
    mpi = "mpi"


class ParallelMode(str, Enum):
    ddp = "ddp"  # DistributedDataParallel: one process per device
    dp = "dp"  # DataParallel: one process drives all devices of its (single) host


class ShardingMode(str, Enum):
    none = "none"
    oss = "oss"  # fairscale OSS: optimizer state sharded, DDP for gradients
    sdp = "sdp"  # fairscale ShardedDataParallel + OSS (ESPnet2's --sharded_ddp)
    zero = "zero"  # torch ZeroRedundancyOptimizer
    fsdp = "fsdp"  # torch FSDP2 fully_shard
    fairscale_fsdp = "fairscale_fsdp"  # not offered: validation explains why and points to fsdp


class DeviceKind(str, Enum):
    auto = "auto"  # cuda when this machine has GPUs (or launcher=slurm and device=cuda), else cpu
    cuda = "cuda"
    cpu = "cpu"


@dataclass
class HostConfig:
    """One host of the topology."""

    name: Optional[str] = None  # host name as the launcher knows it; None: whichever host the launcher gives
    addr: Optional[str] = None  # address the other hosts reach it at; None: the name
    devices: Optional[int] = None  # processes (DDP) or devices (DP) on it; None: topology.devices_per_node
    gpus: Optional[list[int]] = None  # GPU indices to use when devices are GPUs; None: 0..devices-1


@dataclass
class TopologyConfig:
    """Hosts and devices: either a grid (nodes x devices_per_node) or an explicit host list."""

    nodes: Optional[int] = None  # number of hosts; None: len(hosts)
    devices_per_node: Optional[int] = None  # devices on each host that does not give its own count
    hosts: Optional[list[HostConfig]] = None  # explicit hosts; None: `nodes` unnamed hosts


@dataclass
class InitConfig:
    """Rendezvous: how the processes find each other."""

    method: InitMethod = InitMethod.env
    master_addr: Optional[str] = None  # None: 127.0.0.1 on one host, else host 0 (Slurm/MPI: first node)
    master_port: int = 0  # 0: a free port chosen per run (Slurm: derived from the job id)
    dir: Optional[str] = None  # file init: folder every host sees; None: the run's output folder
    timeout_s: float = 300.0  # rendezvous and collective timeout


@dataclass
class SlurmOptions:
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    time: str = "01:00:00"  # sbatch --time
    cpus_per_task: Optional[int] = None  # None: Slurm's default
    mem: Optional[str] = None  # sbatch --mem per node, e.g. 32G
    gpu_request: str = "gpus-per-node"  # how GPUs are asked for: gpus-per-node | gres
    signal: str = "USR1@90"  # sbatch --signal: sent before the time limit, asks the recipe to checkpoint
    requeue: bool = False
    extra: list[str] = field(default_factory=list)  # more #SBATCH lines, e.g. ["--constraint=a100"]
    follow: bool = True  # wait for a submitted job and return its exit status
    array_parallelism: Optional[int] = None  # a sweep's job array: at most this many of its jobs at once (--array=...%N)


@dataclass
class MpiOptions:
    mpirun: str = "mpirun"
    allow_run_as_root: bool = False
    oversubscribe: bool = False
    extra: list[str] = field(default_factory=list)  # more mpirun arguments, passed as given
    export: list[str] = field(default_factory=list)  # variables mpirun passes to every rank (-x NAME), e.g. [PYTHONPATH]


@dataclass
class ManualOptions:
    host: Optional[str] = None  # which spec host this machine is: an index or a name/address; None: match


@dataclass
class SshOptions:
    """launcher=ssh: how `run` logs in to every host to start its share (the system ssh client, with your
    ~/.ssh/config, agent and ProxyJump)."""

    command: str = "ssh"  # the ssh client
    user: Optional[str] = None  # ssh -l USER; None: ssh's own choice (~/.ssh/config, then your user name)
    port: Optional[int] = None  # ssh -p PORT; None: ssh's own choice
    identity_file: Optional[str] = None  # ssh -i FILE; None: ssh's own keys and agent
    config_file: Optional[str] = None  # ssh -F FILE; None: ssh reads ~/.ssh/config as usual
    options: list[str] = field(default_factory=list)  # more ssh -o options, each KEY=VALUE, e.g. ["ProxyJump=bastion"]
    connect_timeout_s: int = 10  # ssh -o ConnectTimeout: a host that does not answer is refused this soon
    keepalive_s: int = 5  # ssh -o ServerAliveInterval (ServerAliveCountMax=3): a host that stops answering is lost
    # after three intervals; 0: only a closed connection tells
    export: list[str] = field(default_factory=list)  # variables whose values here every host gets (env NAME=value
    # on its command line), e.g. [HF_HOME]
    run: Optional[str] = None  # the `run` command on the hosts; None: the path of the `run` you started


@dataclass
class LauncherConfig:
    """Who starts the processes, and what one task of theirs is."""

    kind: str = "local"  # a registered launcher (runner.launchers.LAUNCHERS): local, manual, ssh, slurm, mpi
    tasks: TaskMode = TaskMode.per_host
    python: Optional[str] = None  # interpreter for the tasks a scheduler starts; None: the one running `run`
    stop_signal: str = "USR1"  # asks the ranks to checkpoint and stop (ctx.should_stop), as Slurm's time-limit
    # signal does (launcher=slurm: launcher.slurm.signal): `kill -USR1 <pid of run>`
    grace_s: float = 10.0  # on SIGTERM, ranks are asked to checkpoint and stop (ctx.should_stop) and get this
    # long before they are terminated; Ctrl-C (SIGINT) stops them at once
    stall_timeout_s: Optional[float] = None  # end the job when no rank completed a collective or a progress
    # step for this long, saying which collective each rank is in (None: only init.timeout_s ends a hang)
    snapshot_code: Optional[bool] = None  # copy the job's code (git-tracked files, or snapshot_files) into the run
    # folder at submission and import it from there, so a requeued or restarted attempt runs the submitted code;
    # None: on for Slurm batch jobs from a git repository, off elsewhere (the launch there is the code's moment)
    snapshot_files: list[str] = field(default_factory=list)  # globs under workdir to copy instead of git's files
    snapshot_max_mb: float = 200.0  # a snapshot larger than this is refused, naming its largest files
    max_restarts: int = 0  # start the job again after a failure, up to this many times (local; manual and ssh:
    # every host's `run` together; mpi: mpirun again); the recipe resumes from the run's last checkpoint (Slurm:
    # launcher.slurm.requeue)
    slurm: SlurmOptions = field(default_factory=SlurmOptions)
    mpi: MpiOptions = field(default_factory=MpiOptions)
    manual: ManualOptions = field(default_factory=ManualOptions)
    ssh: SshOptions = field(default_factory=SshOptions)


@dataclass
class BackendConfig:
    name: BackendName = BackendName.auto
    socket_ifname: Optional[str] = None  # GLOO/NCCL_SOCKET_IFNAME for every process; None: runner's choice
    pick_interface: bool = True  # several hosts: each uses the interface of its route to the master
    # (runner/network.py); false leaves the choice to gloo and NCCL, as plain torchrun does
    env: dict[str, str] = field(default_factory=dict)  # more variables: +backend.env.NCCL_DEBUG=INFO


# Variables the runner sets for every process from the plan: backend.env may not set them (validation says so).
RUNNER_VARIABLES = frozenset({
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "ROLE_RANK",
    "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES",
    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE",
})


@dataclass
class ParallelConfig:
    mode: ParallelMode = ParallelMode.ddp
    find_unused_parameters: bool = False
    bucket_cap_mb: float = 25.0


@dataclass
class ShardingConfig:
    """How ctx.setup shards training (runner/sharding.py); needs parallel=ddp and 2 or more processes."""

    mode: ShardingMode = ShardingMode.none
    reshard_after_forward: bool = True  # fsdp only: free each unit's gathered parameters after its forward
    reduce_buffer_size: int = 0  # sdp only: fairscale's gradient bucket (elements); 0: each gradient is
    # reduced to its owner and dropped elsewhere (gradients sharded); > 0: small gradients share
    # unsharded buckets (fewer messages, no gradient sharding for them)


@dataclass
class RecipeConfig:
    """What every recipe's config has; a recipe's own schema extends it."""

    target: str = MISSING  # "package.module:function" or "package.module" (then its `main`), imported from
    # the job's folder (workdir) first, then the installed packages (runner.spec.targets)
    global_batch_size: Optional[int] = 64  # kept whatever the world size; per process = global / world size
    seed: int = 0
    init_process_group: bool = True  # the runner makes the default process group before calling the recipe;
    # false: the recipe makes its own (recipe=script: a torchrun-style script calls init_process_group itself)


@dataclass
class DigitsRecipeConfig(RecipeConfig):
    target: str = "runner.recipes.digits:main"
    epochs: int = 20
    lr: float = 0.003
    hidden: int = 64
    test_fraction: float = 0.25
    resume: Optional[str] = None  # a checkpoint (of any sharding mode and world size) to continue from
    stop_check_every: int = 5  # steps between checks for a stop request (Slurm's time-limit signal)


SCRIPT_TARGET = "runner.worker.script:run_script"  # recipe=script: the rank runs the script as its main program


@dataclass
class ScriptRecipeConfig(RecipeConfig):
    target: str = SCRIPT_TARGET
    global_batch_size: Optional[int] = None  # the script batches its data itself
    init_process_group: bool = False  # the script calls init_process_group itself
    path: Optional[str] = None  # a torchrun-style training script, relative to the job's folder (workdir) or absolute
    module: Optional[str] = None  # or a module run as `python -m` runs it (`run ... -- -m pkg.train`); one of the two
    args: list[str] = field(default_factory=list)  # its arguments; `run [overrides] -- train.py --lr=0.1` sets both
    local_rank_arg: Optional[str] = None  # --local_rank or --local-rank: append <flag>=<local rank> to each
    # process's arguments, as torch.distributed.launch did (for scripts that require it)


@dataclass
class LogConfig:
    """What the terminal shows of the ranks, and what they record for diagnosis."""

    console: str = "main"  # whose output streams to the terminal: main (each host's first process), all, or ranks
    # such as "0,3"; with all or a list, each line is prefixed [rank r host]; every rank's log stays complete
    collectives: int = 200  # collectives each rank keeps for a hang's diagnosis (torch's flight recorder); 0: none


@dataclass
class JobConfig:
    """A whole job: what the primary config `job.yaml` composes."""

    topology: TopologyConfig = MISSING
    init: InitConfig = MISSING
    launcher: LauncherConfig = MISSING
    backend: BackendConfig = MISSING
    parallel: ParallelConfig = MISSING
    sharding: ShardingConfig = MISSING
    recipe: Any = MISSING  # a RecipeConfig subclass, chosen by the recipe group
    device: DeviceKind = DeviceKind.auto
    log: LogConfig = field(default_factory=LogConfig)
    dry_run: bool = False
    preflight: bool = False  # launch as a real run, but instead of the recipe each host checks the master address
    # (resolves, not loopback), the route and interface, the port (free on host 0, reachable from the others) or the
    # init file's folder, its devices; then every process all-reduces once; one line per host (runner/preflight.py)
    run_id: Optional[str] = None  # None: a fresh id per run; the manual launcher pins one for all hosts
    workdir: Optional[str] = None  # the job's folder: every process starts in it and imports the user's modules
    # from it first, as `python -m` does; None: the folder `run` is started from (pinned in the run's spec.yaml)
    code_dir: Optional[str] = None  # where the user's modules and scripts come from, when not workdir: the run's
    # copy of the code (launcher.snapshot_code), pinned by the launch


# The recipe group's schemas (schema/recipe/<name>): its options (conf/recipe/) build on them
RECIPE_SCHEMAS: dict[str, type[RecipeConfig]] = {"base": RecipeConfig, "digits": DigitsRecipeConfig,
                                                 "script": ScriptRecipeConfig}


def recipe_schema(recipe: Mapping[str, Any]) -> type[RecipeConfig] | None:
    """The schema of a recipe config read back untyped (from a run's spec.yaml): the recipe schema of its own (digits,
    script: not the base every recipe has) whose keys it has, exactly, as the spec was written; None: no schema's
    (recipe=custom), which stays untyped."""
    for schema in RECIPE_SCHEMAS.values():
        if schema.target != MISSING and set(recipe) == {f.name for f in fields(schema)}:
            return schema
    return None


def is_script(recipe: Any) -> bool:
    """The recipe is recipe=script (a typed config, an untyped one naming its target, or the runner's settings of
    either)."""
    return isinstance(recipe, ScriptRecipeConfig) or recipe_settings(recipe).target == SCRIPT_TARGET


def recipe_settings(recipe: Any) -> RecipeConfig:
    """What the runner itself reads of any recipe config: typed (a RecipeConfig) or a user's untyped dict."""
    if isinstance(recipe, RecipeConfig):
        return recipe
    if not isinstance(recipe, dict):
        return RecipeConfig(target=repr(recipe))
    base = RecipeConfig()
    return RecipeConfig(target=recipe.get("target", ""), global_batch_size=recipe.get("global_batch_size", base.global_batch_size),
                        seed=recipe.get("seed", base.seed),
                        init_process_group=recipe.get("init_process_group", base.init_process_group))


def unknown_keys(cfg: Any, prefix: str = "") -> list[tuple[str, list[str]]]:
    """Keys a composed config has beyond its schema: (full key, the schema's keys). Hydra's ``+key=value``
    adds keys even to a typed node; a recipe's untyped config (recipe=custom) takes any key."""
    from dataclasses import is_dataclass

    from omegaconf import DictConfig, OmegaConf

    found: list[tuple[str, list[str]]] = []
    if not isinstance(cfg, DictConfig):
        return found
    schema = OmegaConf.get_type(cfg)
    known = [f.name for f in fields(schema)] if schema is not None and is_dataclass(schema) else None
    for key, value in cfg.items_ex(resolve=False):  # a missing (???) node is its marker string here, not a dict
        full = f"{prefix}{key}"
        if known is not None and key not in known:
            found.append((full, known))
        elif isinstance(value, DictConfig):
            found += unknown_keys(value, full + ".")
    return found


def register_schemas() -> None:
    """Store the schemas where the YAML options under conf/ find them (`/schema/<group>@_here_`)."""
    cs = ConfigStore.instance()
    cs.store(name="job_schema", node=JobConfig)
    for group, schema in (
        ("topology", TopologyConfig),
        ("init", InitConfig),
        ("launcher", LauncherConfig),
        ("backend", BackendConfig),
        ("parallel", ParallelConfig),
        ("sharding", ShardingConfig),
    ):
        cs.store(group=f"schema/{group}", name="base", node=schema)
    for name, schema in RECIPE_SCHEMAS.items():
        cs.store(group="schema/recipe", name=name, node=schema)
