"""Every rule a spec must pass before any process starts: the generic ones here, each launcher's own in
its class (runner.launchers), asked through :class:`LauncherRules`.

:func:`validate` resolves what the spec leaves open (hosts from the grid shorthand, ``device=auto``,
``backend=auto``, the master address) and returns the resolved :class:`~runner.spec.job.Job` with every
problem found: all of them at once, each naming its key, showing the arithmetic and giving a hint.
The machine is consulted only through a :class:`~runner.spec.probe.MachineProbe`, and only when a rule
needs it (GPU count when devices are GPUs, MPI support when backend=mpi, folders that must exist).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from collections.abc import Iterator
from typing import Protocol

from runner.common import extras
from runner.common.signals import is_signal_name
from runner.spec.batch import batch_problems
from runner.spec.elastic import ElasticFacts, declares_elasticity, elastic_problems, resolve_spares
from runner.spec.job import Job
from runner.spec.probe import MachineProbe
from runner.spec.problems import Problem, Severity, errors
from runner.spec.schema import (
    RUNNER_VARIABLES,
    BackendName,
    DeviceKind,
    InitMethod,
    JobConfig,
    ParallelConfig,
    ParallelMode,
    ScriptRecipeConfig,
    ShardingMode,
    TaskMode,
    is_script,
    recipe_settings,
)
from runner.spec.targets import TARGET_PATTERN
from runner.spec.topology import Host, is_loopback, is_valid_host, resolve_hosts

_IFNAME = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class LauncherFacts(ElasticFacts, Protocol):
    """What validation reads of a launcher's capabilities (runner.launchers.capabilities.Capabilities); the rules of a
    job that outlives its hosts read theirs (runner.spec.elastic.ElasticFacts)."""

    @property
    def supports_restarts(self) -> bool: ...  # launcher.max_restarts > 0 works with it
    @property
    def restart_hint(self) -> str: ...  # what to do instead, when it does not
    @property
    def gives_mpi_ranks(self) -> bool: ...  # its tasks are MPI ranks (backend=mpi needs them)
    @property
    def shares_run_folder(self) -> bool: ...  # its hosts' processes share the run folder that `run` made (not manual's)


class LauncherRules(Protocol):
    """What validation asks of the job's launcher (each launcher class answers: runner.launchers.base)."""

    name: str
    capabilities: LauncherFacts

    def default_master(self, spec: JobConfig, hosts: tuple[Host, ...]) -> str | None:
        """The master address of a multi-host job whose spec names none; None: found at launch."""

    def spec_problems(self, spec: JobConfig) -> Iterator[Problem]:
        """Its options' problems (no hosts needed)."""

    def job_problems(self, job: Job, probe: MachineProbe) -> Iterator[Problem]:
        """Whether the resolved job fits it (hosts, names, devices)."""


def validate(spec: JobConfig, probe: MachineProbe, launcher: LauncherRules) -> tuple[Job | None, list[Problem]]:
    """Validate ``spec`` for ``launcher``; return the resolved job (None when any error was found) and all
    problems. (runner.launchers.validate picks the launcher the spec names.)"""
    problems: list[Problem] = []
    hosts = resolve_hosts(spec.topology, problems)
    spares = resolve_spares(spec.topology, hosts, problems)
    device = _resolve_device(spec, probe, problems)
    backend = _resolve_backend(spec, device)
    problems += _check_options(spec, launcher)
    problems += launcher.spec_problems(spec)
    problems += _check_backend(spec, device, backend, probe, launcher)
    problems += _check_recipe(spec, probe)
    job = None
    if hosts:
        job = Job(spec, hosts, device, backend, _master_addr(spec, hosts, launcher), spares)
        for rule in _JOB_RULES:
            problems += rule(job, probe, launcher)
        problems += elastic_problems(job, launcher.capabilities)
        problems += launcher.job_problems(job, probe)
    if errors(problems):
        return None, problems
    return job, problems


def _resolve_device(spec: JobConfig, probe: MachineProbe, problems: list[Problem]) -> DeviceKind:
    if spec.device is not DeviceKind.auto:
        return spec.device
    count = probe.cuda_device_count()
    if count > 0:
        problems.append(Problem("device", f"auto: this machine has {count} CUDA GPU(s), so devices are GPUs",
                                "device=cpu to run CPU processes instead", Severity.notice))
        return DeviceKind.cuda
    return DeviceKind.cpu


def _resolve_backend(spec: JobConfig, device: DeviceKind) -> BackendName:
    if spec.backend.name is not BackendName.auto:
        return spec.backend.name
    return BackendName.nccl if device is DeviceKind.cuda else BackendName.gloo


def _master_addr(spec: JobConfig, hosts: tuple[Host, ...], launcher: LauncherRules) -> str | None:
    if spec.init.master_addr is not None:
        return spec.init.master_addr
    if len(hosts) == 1:
        return "127.0.0.1"  # one host: rendezvous on loopback, nothing exposed on the network
    return launcher.default_master(spec, hosts)


def _check_options(spec: JobConfig, launcher: LauncherRules) -> Iterator[Problem]:
    """Each option's own values, family by family (no hosts needed; a family's rules that span hosts or devices are
    the job rules below)."""
    yield from _check_rendezvous_options(spec)
    yield from _check_backend_options(spec)
    yield from _check_sharding_options(spec)
    yield from _check_run_id(spec)
    yield from _check_stopping_options(spec, launcher)
    yield from _check_log(spec)
    yield from _check_snapshot_options(spec)
    yield from _check_stop_signal(spec)


def _check_rendezvous_options(spec: JobConfig) -> Iterator[Problem]:
    """init: the port, the timeout, the master address (and whether it is used at all)."""
    init = spec.init
    if not (init.master_port == 0 or 1 <= init.master_port <= 65535):
        yield Problem("init.master_port", f"{init.master_port} is not a TCP port (1..65535)",
                      "leave it at 0 to get a free port per run")
    elif 0 < init.master_port < 1024:
        yield Problem("init.master_port", f"{init.master_port} is a privileged port (< 1024)",
                      "ports below 1024 need root; leave it at 0 for a free port per run", Severity.warning)
    if not init.timeout_s > 0:
        yield Problem("init.timeout_s", f"must be positive, got {init.timeout_s}",
                      "seconds to wait for every rank at rendezvous and in collectives, e.g. 300")
    if init.master_addr is not None and not is_valid_host(init.master_addr):
        yield Problem("init.master_addr", f"{init.master_addr!r} is not a host name or IP address",
                      "use letters, digits, '-', '_' and '.', or an IP literal")
    if init.method is InitMethod.file and init.master_addr is not None:
        yield Problem("init.master_addr", "is not used with init=file (processes meet through the file)",
                      "drop init.master_addr, or use init=tcp", Severity.warning)


def _check_backend_options(spec: JobConfig) -> Iterator[Problem]:
    """backend: the interface name and the extra variables, which reach every process's environment."""
    if spec.backend.socket_ifname is not None and not _IFNAME.match(spec.backend.socket_ifname):
        yield Problem("backend.socket_ifname", f"{spec.backend.socket_ifname!r} is not an interface name",
                      "an interface as `ip -br link` lists it, e.g. eth0 (15 characters at most, no spaces)")
    for name in spec.backend.env:
        if not ENV_NAME.match(name):
            yield Problem(f"backend.env.{name}", "is not a valid environment variable name",
                          "use letters, digits and '_', not starting with a digit")
        elif name in RUNNER_VARIABLES:
            yield Problem(f"backend.env.{name}", "is set by the runner for every process from the plan; "
                                                 "a value here would contradict it",
                          "change the spec instead (topology, init.master_addr, init.master_port, topology.hosts[i].gpus)")


def _check_sharding_options(spec: JobConfig) -> Iterator[Problem]:
    """sharding: each mode's own option, set under another mode."""
    sharding = spec.sharding
    if sharding.reduce_buffer_size < 0:
        yield Problem("sharding.reduce_buffer_size", f"must be 0 or more, got {sharding.reduce_buffer_size}",
                      "0: each gradient goes to its owner alone (gradients sharded); e.g. 8388608 (2**23, fairscale's "
                      "default) to bucket small gradients")
    elif sharding.reduce_buffer_size and sharding.mode is not ShardingMode.sdp:
        yield Problem("sharding.reduce_buffer_size", f"is only used by sharding=sdp (sharding={sharding.mode.value})",
                      "drop it, or sharding=sdp", Severity.warning)
    if not sharding.reshard_after_forward and sharding.mode is not ShardingMode.fsdp:
        yield Problem("sharding.reshard_after_forward", f"is only used by sharding=fsdp (sharding={sharding.mode.value})",
                      "drop it, or sharding=fsdp", Severity.warning)


def _check_run_id(spec: JobConfig) -> Iterator[Problem]:
    """run_id: it names folders and files on every host."""
    if spec.run_id is not None and not _RUN_ID.match(spec.run_id):
        yield Problem("run_id", f"{spec.run_id!r} is not a safe run id",
                      "letters, digits, '_', '.' and '-', at most 128, starting with a letter or digit")


def _check_stopping_options(spec: JobConfig, launcher: LauncherRules) -> Iterator[Problem]:
    """launcher: restarts (and whether this launcher restarts at all), the grace after a stop, the stall timeout."""
    restarts = spec.launcher.max_restarts
    can = launcher.capabilities
    if restarts < 0:
        yield Problem("launcher.max_restarts", f"must be 0 or more, got {restarts}", "0: no restarts")
    elif restarts and not can.supports_restarts and not (can.survives_lost_hosts and declares_elasticity(spec)):
        yield Problem("launcher.max_restarts", f"launcher={launcher.name} does not restart a job", can.restart_hint)
    grace = spec.launcher.grace_s
    if not grace >= 0:
        yield Problem("launcher.grace_s", f"must be 0 or more, got {grace}",
                      "seconds the ranks get to checkpoint and stop after SIGTERM (or to end after Ctrl-C) before "
                      "they are killed, e.g. 10 (the default); 0: killed at once")
    stall = spec.launcher.stall_timeout_s
    if stall is not None and not stall > 0:
        yield Problem("launcher.stall_timeout_s", f"must be positive, got {stall}",
                      "seconds without a completed collective or progress step before the job is ended, e.g. 120; "
                      "null: no stall watchdog")


def _check_snapshot_options(spec: JobConfig) -> Iterator[Problem]:
    """launcher.snapshot_*: the size limit, and globs that stay inside the job's folder."""
    if not spec.launcher.snapshot_max_mb > 0:
        yield Problem("launcher.snapshot_max_mb", f"must be positive, got {spec.launcher.snapshot_max_mb}",
                      "megabytes of code a snapshot may copy, e.g. 200")
    for i, pattern in enumerate(spec.launcher.snapshot_files):
        if os.path.isabs(pattern) or ".." in Path(pattern).parts:
            yield Problem(f"launcher.snapshot_files[{i}]", f"{pattern!r} reaches outside the job's folder",
                          "globs relative to the folder you start `run` from, e.g. '**/*.py'")


def _check_stop_signal(spec: JobConfig) -> Iterator[Problem]:
    """launcher.stop_signal: a signal's name or number."""
    if not is_signal_name(spec.launcher.stop_signal):
        yield Problem("launcher.stop_signal", f"{spec.launcher.stop_signal!r} is not a signal",
                      "a signal's name or number, e.g. USR1 (the default), USR2 or TERM")


def console_ranks(console: str) -> tuple[int, ...] | None:
    """The ranks of ``log.console`` when it lists them ("0,3"); None for main and all."""
    if console in ("main", "all"):
        return None
    return tuple(int(part) for part in console.split(","))


def _check_log(spec: JobConfig) -> Iterator[Problem]:
    """log: which ranks the terminal shows, how many collectives each keeps."""
    console = str(spec.log.console)
    if console not in ("main", "all"):
        parts = console.split(",")
        if not all(p.strip().isdigit() for p in parts):
            yield Problem("log.console", f"{console!r} is not main, all or a list of ranks",
                          "log.console=main (each host's first process, as today), all, or ranks: log.console='0,3'")
    if spec.log.collectives < 0:
        yield Problem("log.collectives", f"must be 0 or more, got {spec.log.collectives}",
                      "collectives each rank keeps for a hang's diagnosis, e.g. 200; 0: none")


def _check_backend(spec: JobConfig, device: DeviceKind, backend: BackendName, probe: MachineProbe,
                   launcher: LauncherRules) -> Iterator[Problem]:
    if backend is BackendName.nccl and device is DeviceKind.cpu:
        why = "device=cpu" if spec.device is DeviceKind.cpu else "this machine has no CUDA GPU (device=auto chose cpu)"
        yield Problem("backend.name", f"nccl needs CUDA GPUs, but {why}",
                      "backend=gloo (or backend=auto) for CPU processes; device=cuda on a GPU machine")
    if backend is BackendName.mpi:
        if not launcher.capabilities.gives_mpi_ranks:
            yield Problem("backend.name", f"mpi gets ranks from MPI itself, but launcher={launcher.name} starts no MPI ranks",
                          "launcher=mpi with backend=mpi, or backend=gloo/nccl with this launcher")
        elif spec.launcher.tasks is TaskMode.per_host:
            yield Problem("launcher.tasks", "backend=mpi needs one MPI rank per process, but tasks=per_host forks them",
                          "launcher.tasks=per_device")
        if not probe.mpi_backend_available():
            yield Problem("backend.name", "mpi: this torch was not built with MPI (torch.distributed.is_mpi_available() is False)",
                          "backend=gloo (CPU) or nccl (GPU) work with launcher=mpi too; backend=mpi needs torch built from source with MPI")


def _check_recipe(spec: JobConfig, probe: MachineProbe) -> Iterator[Problem]:
    recipe = recipe_settings(spec.recipe)
    workdir = spec.workdir
    if workdir is not None and not (os.path.isabs(workdir) and probe.is_dir(workdir)):
        yield Problem("workdir", f"{workdir!r} is not a folder here" if os.path.isabs(workdir) else
                      f"{workdir!r} is not an absolute path",
                      "leave it unset (the folder `run` is started from), or give an absolute path every host sees")
        return
    if spec.code_dir is not None and not (os.path.isabs(spec.code_dir) and probe.is_dir(spec.code_dir)):
        yield Problem("code_dir", f"{spec.code_dir!r} is not a folder here", "leave it unset: the launch pins it")
        return
    target = recipe.target
    if isinstance(spec.recipe, ScriptRecipeConfig):
        yield from _check_script(spec.recipe, workdir, probe)
    elif is_script(spec.recipe):
        pass  # an untyped config naming the script target (recipe=custom): no schema of a script's to check
    elif not isinstance(target, str) or not TARGET_PATTERN.match(target):
        yield Problem("recipe.target", f"{target!r} is not 'package.module:function' or 'package.module'",
                      "e.g. recipe.target=mypkg.train:main (mypkg/ in the folder you start `run` from)")
    elif (problem := probe.target_problem(target, spec.code_dir or workdir)) is not None:
        yield Problem("recipe.target", problem.message, problem.hint)
    else:
        for extra in extras.RECIPE_EXTRAS.get(target.split(":", 1)[0], ()):
            if not probe.extra_installed(extra.name):
                yield Problem("recipe.target", f"{target}: {extra.missing()}", extra.install)


LOCAL_RANK_FLAGS = ("--local_rank", "--local-rank")


def _check_script(recipe: ScriptRecipeConfig, workdir: str | None, probe: MachineProbe) -> Iterator[Problem]:
    if recipe.path is None and recipe.module is None:
        yield Problem("recipe.path", "recipe=script names no script", "run [overrides] -- train.py [its arguments], "
                      "or -- -m package.module [...]; or recipe.path=train.py (recipe.module=pkg.train)")
    elif recipe.path is not None and recipe.module is not None:
        yield Problem("recipe.module", f"and recipe.path both say what to run ({recipe.module!r}, {recipe.path!r})",
                      "keep one: a script's path, or a module run as `python -m` runs it")
    elif recipe.module is not None:
        if not isinstance(recipe.module, str) or not TARGET_PATTERN.match(recipe.module) or ":" in recipe.module:
            yield Problem("recipe.module", f"{recipe.module!r} is not a module name", "e.g. -- -m mypkg.train")
        elif (problem := probe.module_problem(recipe.module, workdir)) is not None:
            yield Problem("recipe.module", problem.message, problem.hint)
    elif isinstance(recipe.path, str):
        path = os.path.join(workdir, recipe.path) if workdir else recipe.path
        if not probe.exists(path):
            yield Problem("recipe.path", f"{recipe.path!r} does not exist (seen from {workdir or os.getcwd()})",
                          "give the training script's path, relative to the folder you start `run` from, or absolute")
    flag = recipe.local_rank_arg
    if flag is not None and flag not in LOCAL_RANK_FLAGS:
        yield Problem("recipe.local_rank_arg", f"{flag!r} is neither of {' or '.join(LOCAL_RANK_FLAGS)}",
                      "the flag your script's argparse declares, as torch.distributed.launch passed it: "
                      "recipe.local_rank_arg=--local_rank (older scripts) or --local-rank (torch >= 2.0); "
                      "unset for scripts that read LOCAL_RANK from the environment")


def _is_this_machine(host: Host, probe: MachineProbe) -> bool:
    for value in (host.name, host.addr):
        if value is not None and (is_loopback(value) or value in probe.host_names()):
            return True
    return False


def _check_master(job: Job, probe: MachineProbe, launcher: LauncherRules) -> Iterator[Problem]:
    spec, hosts = job.spec, job.hosts
    if len(hosts) == 1:
        return
    master = job.master_addr
    key = "init.master_addr" if spec.init.master_addr is not None else "topology.hosts[0]"
    if master is not None and is_loopback(master):
        remote = [h for h in hosts if not _is_this_machine(h, probe)]
        if remote:
            other = remote[0].reach or remote[0].label
            yield Problem(key, f"the master address {master!r} is loopback, but the job has {len(hosts)} hosts "
                               f"and {other!r} is another machine: it would dial its own loopback and never rendezvous",
                          "give host 0 an address the other hosts can reach (topology.hosts[0].addr=10.0.0.1) "
                          "or set init.master_addr")


def _check_file_init(job: Job, probe: MachineProbe, launcher: LauncherRules) -> Iterator[Problem]:
    spec = job.spec
    if spec.init.method is not InitMethod.file:
        if spec.init.dir is not None:
            yield Problem("init.dir", f"is only used with init=file (init={spec.init.method.value})",
                          "drop init.dir, or use init=file", Severity.warning)
        return
    folder = spec.init.dir
    if folder is not None:
        if not folder.startswith("/"):
            yield Problem("init.dir", f"{folder!r} is relative: hosts and tasks may start elsewhere",
                          "give an absolute path to a folder every host sees, e.g. /shared/$USER/rdzv")
        elif not probe.is_dir(folder):
            what = "is a file" if probe.exists(folder) else "does not exist"
            yield Problem("init.dir", f"{folder!r} {what}",
                          f"create it first (mkdir -p {folder}) on storage every host sees")
    elif len(job.hosts) > 1 and not launcher.capabilities.shares_run_folder:
        yield Problem("init.dir", f"launcher={launcher.name} on several hosts: each host would make its own run folder, "
                                  f"so the rendezvous file must be in a folder they share",
                      "init.dir=/shared/path (NFS or similar, mounted at the same path on every host)")
    elif len(job.hosts) > 1:
        yield Problem("init.dir", "not set: the rendezvous file goes into the run's output folder, "
                                  "which every host must see at the same path",
                      "set init.dir to a shared folder if outputs/ is not on shared storage", Severity.notice)


def _check_devices(job: Job, probe: MachineProbe, launcher: LauncherRules) -> Iterator[Problem]:
    spec, hosts = job.spec, job.hosts
    if job.device is not DeviceKind.cuda:
        if spec.parallel.mode is ParallelMode.dp and hosts[0].devices > 1:
            yield Problem("parallel.mode", f"dp on CPU runs one process; DataParallel splits batches over GPUs only, "
                                           f"so the {hosts[0].devices} CPU devices become 1 process",
                          "parallel=ddp to use several CPU processes", Severity.notice)
        if any(h.gpus != tuple(range(h.devices)) for h in hosts):
            yield Problem("topology.hosts", "gpus are listed but the devices are CPU processes",
                          "drop gpus, or device=cuda", Severity.warning)


def gpus_of_this_machine(job: Job, probe: MachineProbe) -> Iterator[Problem]:
    """The GPUs the job's hosts ask for are on this machine (a launcher that starts them here calls this;
    other hosts' GPUs are counted there, at launch, by preflight)."""
    spec, hosts = job.spec, job.hosts
    if job.device is not DeviceKind.cuda:
        return
    have = probe.cuda_device_count()
    if have == 0:
        yield Problem("device", "cuda, but this machine has no CUDA GPU (torch.cuda.device_count() = 0)",
                      "device=cpu (gloo) on this machine, or run on a GPU machine")
        return
    for h in hosts:
        need = max(h.gpus) + 1
        if need > have:
            key = f"topology.hosts[{h.index}].gpus" if spec.topology.hosts else "topology.devices_per_node"
            yield Problem(key, f"asks for GPUs {list(h.gpus)} ({h.devices} device(s)), but this machine has {have} "
                               f"(torch.cuda.device_count() = {have}; highest index {have - 1})",
                          f"at most {have} devices per host here: topology.devices_per_node={have}")


def _check_parallel(job: Job, probe: MachineProbe, launcher: LauncherRules) -> Iterator[Problem]:
    spec, hosts = job.spec, job.hosts
    mode, sharding = spec.parallel.mode, spec.sharding.mode
    if mode is ParallelMode.dp:
        if len(hosts) > 1:
            yield Problem("parallel.mode", f"dp runs one process that drives one host's devices, but the topology has "
                                           f"{len(hosts)} hosts; modern torch has no single-process multi-device DDP, "
                                           f"so DataParallel inside DDP across hosts is not possible",
                          f"parallel=ddp (one process per device, {sum(h.devices for h in hosts)} processes)")
        if sharding is not ShardingMode.none:
            yield Problem("sharding.mode", f"{sharding.value} shards across processes, but dp is one process",
                          "parallel=ddp with sharding, or sharding=none with dp")
    elif sharding not in (ShardingMode.none, ShardingMode.fairscale_fsdp) and job.world_size == 1:
        yield Problem("sharding.mode", f"{sharding.value} with world size 1 shards nothing: it runs as plain training",
                      "use 2 or more processes to shard", Severity.notice)
    recipe = recipe_settings(spec.recipe)
    yield from batch_problems(recipe.global_batch_size, recipe.micro_batch_size, job.world_size)


_FSDP_HINT = ("sharding=fsdp (torch FSDP2's fully_shard: parameters, gradients and optimizer state sharded; "
              "gloo on CPU and NCCL on GPUs), or sharding=sdp for fairscale's ShardedDDP (ESPnet2's --sharded_ddp)")


def _check_sharding(job: Job, probe: MachineProbe, launcher: LauncherRules) -> Iterator[Problem]:
    spec = job.spec
    mode = spec.sharding.mode
    if mode is ShardingMode.none:
        return
    if mode is ShardingMode.fairscale_fsdp:
        if job.device is DeviceKind.cpu:
            yield Problem("sharding.mode", "fairscale's FullyShardedDataParallel needs CUDA: it allocates its gathered "
                                           "parameters on the GPU (\"Torch not compiled with CUDA enabled\" on CPU), "
                                           "but this job's devices are CPU processes", _FSDP_HINT)
        else:
            yield Problem("sharding.mode", "fairscale's FullyShardedDataParallel is not offered: it was upstreamed into "
                                           "torch as FSDP (now FSDP2, fully_shard), which is maintained and does the same",
                          _FSDP_HINT)
        return
    if mode in (ShardingMode.oss, ShardingMode.sdp) and not probe.extra_installed(extras.FAIRSCALE.name):
        yield Problem("sharding.mode", f"{mode.value}: {extras.FAIRSCALE.missing()}",
                      f"{extras.FAIRSCALE.install}; or torch's own: sharding=zero (optimizer state, like oss) or "
                      f"sharding=fsdp")
    if is_script(spec.recipe):
        yield Problem("sharding.mode", f"{mode.value} is applied by ctx.setup, but recipe=script runs a torchrun-style "
                                       f"script that never sees the run context: nothing would be sharded",
                      "sharding=none with recipe=script (shard inside the script), or a recipe main(ctx, cfg) that "
                      "builds its model and optimizer with ctx.setup")
    if mode in (ShardingMode.sdp, ShardingMode.fsdp) and spec.parallel.mode is ParallelMode.ddp:
        wrapper = "fairscale's ShardedDataParallel" if mode is ShardingMode.sdp else "FSDP2"
        defaults = ParallelConfig()
        for key in ("find_unused_parameters", "bucket_cap_mb"):
            if getattr(spec.parallel, key) != getattr(defaults, key):
                yield Problem(f"parallel.{key}", f"is an option of DistributedDataParallel, which sharding={mode.value} "
                                                 f"does not use ({wrapper} exchanges the gradients)",
                              f"drop it{', or use sharding.reduce_buffer_size' if key == 'bucket_cap_mb' and mode is ShardingMode.sdp else ''}",
                              Severity.warning)


def _check_console(job: Job, probe: MachineProbe, launcher: LauncherRules) -> Iterator[Problem]:
    console = str(job.spec.log.console)
    if console in ("main", "all") or not all(p.strip().isdigit() for p in console.split(",")):
        return
    past = [r for r in console_ranks(console) if r >= job.world_size]
    if past:
        yield Problem("log.console", f"rank(s) {', '.join(map(str, past))} past the last rank (world size "
                                     f"{job.world_size}: ranks 0..{job.world_size - 1})",
                      f"ranks from 0 to {job.world_size - 1}, or log.console=all")


_JOB_RULES = (
    _check_console,
    _check_master,
    _check_file_init,
    _check_devices,
    _check_parallel,
    _check_sharding,
)
