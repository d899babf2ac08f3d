"""The typed schema of a job spec.

Every YAML option under ``conf/`` is merged onto one of these dataclasses (registered in Hydra's
ConfigStore by :func:`register_schemas`), so a misspelt key, a wrong type or an unknown choice fails
at composition time with Hydra's message naming the key. Rules that span several keys live in
:mod:`runner.spec.validation`, not here.

Each field's documentation is the string right after it (its first line a summary, which `run --help` shows:
runner.app.help), read by :func:`field_docs`; OmegaConf ignores those strings.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from enum import Enum
from typing import Any, Optional

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
    auto = "auto"  # cuda when the machine that checks the spec has CUDA GPUs, else cpu
    cuda = "cuda"
    cpu = "cpu"


@dataclass
class HostConfig:
    """One host of the topology."""

    name: Optional[str] = None
    """The host's name as the launcher knows it; null: whichever host the launcher gives."""
    addr: Optional[str] = None
    """The address the other hosts reach it at; null: its name."""
    devices: Optional[int] = None
    """Processes (DDP) or devices (DP) on it; null: topology.devices_per_node."""
    gpus: Optional[list[int]] = None
    """GPU indices to use when the devices are GPUs; null: 0..devices-1."""


@dataclass
class TopologyConfig:
    """Hosts and devices: either a grid (nodes x devices_per_node) or an explicit host list."""

    nodes: Optional[int] = None
    """Number of hosts; null: as many as topology.hosts lists."""
    devices_per_node: Optional[int] = None
    """Devices on each host that does not give its own count."""
    hosts: Optional[list[HostConfig]] = None
    """The hosts, each with name, addr, devices and gpus; null: topology.nodes unnamed hosts."""
    hostfile: Optional[str] = None
    """A hostfile of the hosts (DeepSpeed's or Open MPI's: NAME slots=N); null: none.

    `run` reads it into topology.hosts as it starts (runner.spec.hostfile)."""
    min_nodes: Optional[int] = None
    """The fewest hosts the job goes on with (torchrun's --nnodes=MIN:MAX); null: every host.

    While at least this many remain, a lost host ends the attempt and the job restarts on the others from the last
    checkpoint (each change counts against launcher.max_restarts); null: a lost host ends the job."""
    spares: list[HostConfig] = field(default_factory=list)
    """Hosts checked at the start and kept ready: a spare takes a lost host's place, so the world size stays."""
    max_nodes: Optional[int] = None
    """The most hosts the job grows back to (torchrun's --nnodes=MIN:MAX); null: the spec's hosts.

    launcher=ssh: a lost host that answers again joins at the next checkpoint while the job has fewer hosts than this
    (launcher.ssh.rejoin_s, launcher.rejoin_after_s); launcher=manual: a lost host whose `run` is typed again, or
    still runs (its link back up, its machine woken), or a spare standing by, joins the same way."""


@dataclass
class InitConfig:
    """Rendezvous: how the processes find each other."""

    method: InitMethod = InitMethod.env
    """How the processes rendezvous: env://, tcp://addr:port, or a fresh file:// per run."""
    master_addr: Optional[str] = None
    """The master's address; null: 127.0.0.1 on one host, else host 0 (Slurm, MPI: the first node)."""
    master_port: int = 0
    """The master's port; 0: a free port chosen per run (Slurm: derived from the job id)."""
    dir: Optional[str] = None
    """init=file: a folder every host sees, for the rendezvous file; null: the run's folder."""
    timeout_s: float = 300.0
    """Seconds to wait for every rank at the rendezvous and in each collective."""


@dataclass
class SlurmOptions:
    """launcher=slurm: what the batch job asks Slurm for, and how `run` follows it."""

    partition: Optional[str] = None
    """sbatch --partition; null: Slurm's default."""
    account: Optional[str] = None
    """sbatch --account; null: Slurm's default."""
    qos: Optional[str] = None
    """sbatch --qos; null: Slurm's default."""
    time: str = "01:00:00"
    """sbatch --time: the job's time limit."""
    cpus_per_task: Optional[int] = None
    """sbatch --cpus-per-task; null: Slurm's default."""
    mem: Optional[str] = None
    """sbatch --mem: memory per node, e.g. 32G; null: Slurm's default."""
    gpu_request: str = "gpus-per-node"
    """How GPUs are asked for: gpus-per-node or gres."""
    signal: str = "USR1@90"
    """sbatch --signal: sent before the time limit, it asks the recipe to checkpoint and stop."""
    requeue: bool = False
    """Requeue the job after the time limit or a preemption; the recipe resumes from its checkpoint."""
    extra: list[str] = field(default_factory=list)
    """More #SBATCH lines, e.g. [--constraint=a100]."""
    follow: bool = True
    """Wait for a submitted job, showing its output, and exit with its status."""
    array_parallelism: Optional[int] = None
    """A sweep's job array runs at most this many of its jobs at once (--array=...%N); null: no cap."""
    keepalive_s: int = 2
    """Seconds between a task's 'alive' lines, in a job that outlives its nodes; four missed: its node is lost.

    Only with topology.min_nodes or topology.spares (runner.launchers.slurm.rounds)."""


@dataclass
class MpiOptions:
    """launcher=mpi: how `run` calls mpirun."""

    mpirun: str = "mpirun"
    """The mpirun command."""
    allow_run_as_root: bool = False
    """mpirun --allow-run-as-root."""
    oversubscribe: bool = False
    """mpirun --oversubscribe: more processes than a host has cores."""
    extra: list[str] = field(default_factory=list)
    """More mpirun arguments, passed as given."""
    export: list[str] = field(default_factory=list)
    """Variables mpirun passes to every rank (-x NAME), e.g. [PYTHONPATH]."""


@dataclass
class ManualOptions:
    """launcher=manual: which host this `run` is, and, for a job that outlives its hosts, where its hosts agree."""

    host: Optional[str] = None
    """Which spec host this machine is: an index, a name or an address; null: found by matching this machine.

    A name the spec does not list is a host that arrives: it joins a running job at a checkpoint, up to
    topology.max_nodes (a job that outlives its hosts), as a spare started late does."""
    addr: Optional[str] = None
    """Where the other hosts reach a host that arrives (one launcher.manual.host names, the spec not); null: its name."""
    keepalive_s: int = 2
    """Seconds between a host's keepalives in the job's etcd, in a job that outlives its hosts; four missed: lost.

    Only with topology.min_nodes or topology.spares (runner.launchers.manual.watch)."""
    etcd: list[str] = field(default_factory=list)
    """An etcd of yours (host:port of its members' client URLs) where the hosts decide who goes on after a loss.

    Empty: every host's and spare's `run` starts a member of the job's own etcd (Debian's etcd-server), which decides
    while a majority of them is up. Only with topology.min_nodes or topology.spares (runner.launchers.elastic)."""


@dataclass
class SshOptions:
    """launcher=ssh: how `run` logs in to every host to start its share (the system ssh client, with your
    ~/.ssh/config, agent and ProxyJump)."""

    command: str = "ssh"
    """The ssh client."""
    user: Optional[str] = None
    """ssh -l USER; null: ssh's own choice (~/.ssh/config, then your user name)."""
    port: Optional[int] = None
    """ssh -p PORT; null: ssh's own choice."""
    identity_file: Optional[str] = None
    """ssh -i FILE; null: ssh's own keys and agent."""
    config_file: Optional[str] = None
    """ssh -F FILE; null: ssh reads ~/.ssh/config as usual."""
    options: list[str] = field(default_factory=list)
    """More ssh -o options, each KEY=VALUE, e.g. [ProxyJump=bastion]."""
    connect_timeout_s: int = 10
    """ssh -o ConnectTimeout: a host that does not answer is refused this soon."""
    keepalive_s: int = 5
    """ssh -o ServerAliveInterval (ServerAliveCountMax=3): a host silent for three intervals is lost.

    0: only a closed connection tells."""
    rejoin_s: int = 10
    """Seconds between tries of a lost host, in a job that outlives its hosts; 0: a lost host is not taken back.

    The try is the check of the start; a host that passes joins at the next checkpoint (topology.max_nodes,
    launcher.rejoin_after_s)."""
    export: list[str] = field(default_factory=list)
    """Variables whose values here every host gets (env NAME=value on its command line), e.g. [HF_HOME]."""
    run: Optional[str] = None
    """The `run` command on the hosts; null: the path of the `run` you started."""


@dataclass
class LauncherConfig:
    """Who starts the processes, and what one task of theirs is."""

    kind: str = "local"
    """A registered launcher (runner.launchers.LAUNCHERS): local, manual, ssh, slurm or mpi."""
    tasks: TaskMode = TaskMode.per_host
    """What a task of the launcher is: one per host that forks its processes, or one per process."""
    python: Optional[str] = None
    """The interpreter of the tasks a scheduler starts; null: the one running `run`."""
    stop_signal: str = "USR1"
    """The signal that asks the ranks to checkpoint and stop (ctx.should_stop): `kill -USR1 <pid of run>`.

    As Slurm's time-limit signal does (launcher=slurm: launcher.slurm.signal)."""
    grace_s: float = 10.0
    """Seconds the ranks get to checkpoint and stop after SIGTERM before they are killed.

    SIGTERM asks them to checkpoint and stop (ctx.should_stop); Ctrl-C (SIGINT) stops them at once."""
    stall_timeout_s: Optional[float] = None
    """End the job when no rank completed a collective or a progress step for this long; null: never.

    The job's end says which collective each rank is in; without it only init.timeout_s ends a hang."""
    snapshot_code: Optional[bool] = None
    """Copy the job's code into the run folder and import it from there; null: for Slurm batch jobs from git.

    The copy is taken at submission (git-tracked files, or snapshot_files), so that a requeued or restarted attempt
    runs the submitted code; off elsewhere, where the launch is the code's moment."""
    snapshot_files: list[str] = field(default_factory=list)
    """Globs under workdir that a code snapshot copies instead of git's files."""
    snapshot_max_mb: float = 200.0
    """A code snapshot larger than this is refused, naming its largest files."""
    rejoin_after_s: float = 60.0
    """Seconds after a lost host was taken back before it may be taken back again (launcher=ssh, launcher=manual).

    Each join is a restart: a host that flaps costs at most one restart per this many seconds."""
    max_restarts: int = 0
    """Start the job again after a failure, up to this many times; the recipe resumes from its last checkpoint.

    local; manual and ssh: every host's `run` together; mpi: mpirun again (Slurm: launcher.slurm.requeue)."""
    slurm: SlurmOptions = field(default_factory=SlurmOptions)
    """launcher=slurm's options."""
    mpi: MpiOptions = field(default_factory=MpiOptions)
    """launcher=mpi's options."""
    manual: ManualOptions = field(default_factory=ManualOptions)
    """launcher=manual's options."""
    ssh: SshOptions = field(default_factory=SshOptions)
    """launcher=ssh's options."""


@dataclass
class BackendConfig:
    """The torch.distributed backend and what its processes get."""

    name: BackendName = BackendName.auto
    """The torch.distributed backend; auto: nccl on CUDA GPUs, gloo otherwise."""
    socket_ifname: Optional[str] = None
    """GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME for every process; null: the runner's choice."""
    pick_interface: bool = True
    """On several hosts, each uses the interface of its route to the master (runner/worker/network.py).

    false leaves the choice to gloo and NCCL, as plain torchrun does."""
    pair_check_s: float = 5.0
    """Seconds each host waits for every other's answer on that interface before each attempt; 0: no check.

    On several hosts, before the ranks start, every pair of hosts dials each other there (a connection each way); a
    host that fails is named and left out (runner/worker/pair_check.py)."""
    env: dict[str, str] = field(default_factory=dict)
    """More variables for every process, e.g. +backend.env.NCCL_DEBUG=INFO."""


# Variables the runner sets for every process from the plan: backend.env may not set them (validation says so).
RUNNER_VARIABLES = frozenset({
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "ROLE_RANK",
    "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES",
    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE",
})


@dataclass
class ParallelConfig:
    """DistributedDataParallel or DataParallel, and DDP's own options."""

    mode: ParallelMode = ParallelMode.ddp
    """ddp: one process per device; dp: one process drives all devices of its (single) host."""
    find_unused_parameters: bool = False
    """DDP's find_unused_parameters."""
    bucket_cap_mb: float = 25.0
    """DDP's bucket_cap_mb."""


@dataclass
class ShardingConfig:
    """How ctx.setup shards training (runner/training/sharding.py); needs parallel=ddp and 2 or more processes."""

    mode: ShardingMode = ShardingMode.none
    """none, or what is sharded: oss, sdp (fairscale), zero (torch ZeRO), fsdp (torch FSDP2)."""
    reshard_after_forward: bool = True
    """fsdp only: free each unit's gathered parameters after its forward."""
    reduce_buffer_size: int = 0
    """sdp only: fairscale's gradient bucket, in elements; 0: each gradient reduced to its owner alone.

    0 shards the gradients (each is dropped elsewhere); > 0: small gradients share unsharded buckets (fewer
    messages, no gradient sharding for them)."""


@dataclass
class RecipeConfig:
    """What every recipe's config has; a recipe's own schema extends it."""

    target: str = MISSING
    """The recipe: "package.module:function", or "package.module" (its main).

    Imported from the job's folder (workdir) first, then the installed packages (runner.spec.targets)."""
    global_batch_size: Optional[int] = 64
    """The global batch, kept whatever the world size; split exactly over the processes (runner.spec.batch).

    Each process takes G // W samples of it, the first G % W processes one more; at least one per process."""
    micro_batch_size: Optional[int] = None
    """The most samples one process puts through the model at once (null: its whole share).

    A larger share is accumulated over micro-batches (ctx.micro_batches) into the same step."""
    seed: int = 0
    """The random seed: torch is seeded with it in every process."""
    init_process_group: bool = True
    """The runner makes the default process group before calling the recipe; false: the recipe makes its own.

    recipe=script: a torchrun-style script calls init_process_group itself."""


@dataclass
class DigitsRecipeConfig(RecipeConfig):
    """A small MLP on scikit-learn's bundled handwritten digits."""

    target: str = "runner.recipes.digits:main"
    """The bundled digits recipe."""
    epochs: int = 20
    """Passes over the training set."""
    lr: float = 0.003
    """Adam's learning rate."""
    hidden: int = 64
    """Units of the MLP's hidden layer."""
    test_fraction: float = 0.25
    """Share of the images held out for the test accuracy."""
    resume: Optional[str] = None
    """A checkpoint (of any sharding mode and world size) to continue from."""
    stop_check_every: int = 5
    """Steps between checks for a stop request (Slurm's time-limit signal)."""


SCRIPT_TARGET = "runner.worker.script:run_script"  # recipe=script: the rank runs the script as its main program


@dataclass
class ScriptRecipeConfig(RecipeConfig):
    """An unchanged torchrun-style script, run as each rank's main program."""

    target: str = SCRIPT_TARGET
    """The runner's script runner (each rank runs the script as its main program)."""
    global_batch_size: Optional[int] = None
    """null: the script batches its data itself."""
    init_process_group: bool = False
    """false: the script calls init_process_group itself."""
    path: Optional[str] = None
    """A torchrun-style training script, relative to the job's folder (workdir) or absolute."""
    module: Optional[str] = None
    """Or a module, run as `python -m` runs it (`run ... -- -m pkg.train`); one of path and module."""
    args: list[str] = field(default_factory=list)
    """The script's arguments; `run [overrides] -- train.py --lr=0.1` sets both."""
    local_rank_arg: Optional[str] = None
    """--local_rank or --local-rank: append <flag>=<local rank> to each process's arguments.

    As torch.distributed.launch did, for scripts that require it."""


@dataclass
class LogConfig:
    """What the terminal shows of the ranks, and what they record for diagnosis."""

    console: str = "main"
    """Whose output reaches the terminal: main (each host's first process), all, or ranks such as "0,3".

    With all or a list, each line is prefixed [rank r host]; every rank's log stays complete."""
    collectives: int = 200
    """Collectives each rank keeps for a hang's diagnosis (torch's flight recorder); 0: none."""


@dataclass
class JobConfig:
    """A whole job: what the primary config `job.yaml` composes."""

    topology: TopologyConfig = MISSING
    """Hosts and devices (the topology group)."""
    init: InitConfig = MISSING
    """Rendezvous (the init group)."""
    launcher: LauncherConfig = MISSING
    """Who starts the processes (the launcher group)."""
    backend: BackendConfig = MISSING
    """The torch.distributed backend (the backend group)."""
    parallel: ParallelConfig = MISSING
    """DDP or DP (the parallel group)."""
    sharding: ShardingConfig = MISSING
    """Optimizer, gradient and parameter sharding (the sharding group)."""
    recipe: Any = MISSING
    """The training code and its settings: a RecipeConfig subclass, chosen by the recipe group."""
    device: DeviceKind = DeviceKind.auto
    """What a device is; auto: cuda when the machine that checks the spec has CUDA GPUs, else cpu."""
    log: LogConfig = field(default_factory=LogConfig)
    """What the terminal shows, and what ranks record for a hang."""
    dry_run: bool = False
    """Print the spec, the verdict, the plan and the exact launch; start nothing."""
    preflight: bool = False
    """Launch as a real run, but check each host instead of running the recipe; one line per host.

    Each host checks the master address (resolves, not loopback), the route and interface, the port (free on host
    0, reachable from the others) or the init file's folder, its devices; then every process all-reduces once
    (runner/worker/preflight/)."""
    run_id: Optional[str] = None
    """The run's id, and its folder outputs/runs/<run_id>; null: a fresh one per run (the manual launcher pins one)."""
    workdir: Optional[str] = None
    """The job's folder: every process starts in it and imports the user's modules from it first.

    As `python -m` does; null: the folder `run` is started from (pinned in the run's spec.yaml)."""
    code_dir: Optional[str] = None
    """Where the user's modules and scripts come from, when not workdir: the run's copy of the code.

    Pinned by the launch (launcher.snapshot_code); not set by hand."""


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
                        micro_batch_size=recipe.get("micro_batch_size", base.micro_batch_size),
                        seed=recipe.get("seed", base.seed),
                        init_process_group=recipe.get("init_process_group", base.init_process_group))


@functools.cache
def field_docs(schema: type) -> dict[str, str]:
    """The documentation of each field of the dataclass ``schema`` (the string right after the field in its class
    body), its bases' for the fields it inherits."""
    docs: dict[str, str] = {}
    for cls in reversed(schema.__mro__):
        if not is_dataclass(cls):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body  # type: ignore[attr-defined]
        for node, following in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                    and isinstance(following.value.value, str)):
                docs[node.target.id] = inspect.cleandoc(following.value.value)
    return docs


def unknown_keys(cfg: Any, prefix: str = "") -> list[tuple[str, list[str]]]:
    """Keys a composed config has beyond its schema: (full key, the schema's keys). Hydra's ``+key=value``
    adds keys even to a typed node; a recipe's untyped config (recipe=custom) takes any key."""
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


@functools.cache
def register_schemas() -> None:
    """Store the schemas where the YAML options under conf/ find them (`/schema/<group>@_here_`); once a process (the
    ConfigStore keeps them, and each store builds its schema's structured config anew: a sweep's every job, and every
    composition of the tests, registers). Hydra is imported here, not with the schemas: a rank, a host's share and
    a Slurm task read a spec without it (a tenth of a CPU-second in every zygote)."""
    from hydra.core.config_store import ConfigStore

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
