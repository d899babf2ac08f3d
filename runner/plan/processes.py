"""The plan: one record per process, from a validated job, by a pure function.

Rank assignment (:func:`make_plan`), for hosts h_0 .. h_{N-1} in spec order with n_i processes each:

* node rank of h_i = i;
* local ranks on h_i = 0 .. n_i - 1;
* global rank of local rank l on h_i = l + sum(n_j for j < i)   (prefix sum of the hosts before);
* world size = sum(n_i).

Under DDP n_i is h_i's device count (one process per device); under DP n_i = 1 and the process
drives all of h_i's devices. Ranks are therefore contiguous and unique, and the processes of a
host hold a contiguous block of ranks, which is what per-host spawning and Slurm's block
distribution both produce.

Values that only the launch can know (a free port, the first node of a Slurm allocation) are
:class:`Deferred`: strings that say where the value will come from.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate

from runner.spec.job import Job
from runner.plan.paths import RunPaths
from runner.spec.schema import DeviceKind, InitMethod, ParallelMode
from runner.spec.topology import Host


class Deferred(str):
    """A value fixed at launch; its text says by whom, e.g. ``<free port chosen at launch>``."""

    @classmethod
    def of(cls, source: str) -> "Deferred":
        return cls(f"<{source}>")


@dataclass(frozen=True, slots=True)
class ProcessRecord:
    """One process of the job."""

    global_rank: int
    local_rank: int
    node_rank: int
    local_world_size: int
    host: str  # the host's name, or node<i> when the launcher picks the machine
    device: str  # "cpu", "cuda:<i>" (index among the host's visible GPUs)
    device_ids: tuple[int, ...]  # visible GPU indices this process uses (DP: all of the host's); () on CPU


@dataclass(frozen=True)
class Plan:
    job: Job
    records: tuple[ProcessRecord, ...]
    master_addr: str
    master_port: str
    init_method: str  # the init_method URL every process passes to init_process_group

    @property
    def world_size(self) -> int:
        return len(self.records)

    def host_records(self, node_rank: int) -> tuple[ProcessRecord, ...]:
        """The records of one host: a contiguous block, found by the rank prefix sums."""
        start = self._host_starts[node_rank]
        return self.records[start:start + self._host_counts[node_rank]]

    @cached_property
    def _host_counts(self) -> list[int]:
        return [_processes_on(h, self.job) for h in self.job.hosts]

    @cached_property
    def _host_starts(self) -> list[int]:
        return [0, *accumulate(self._host_counts)]

    def init_url(self, port: str | int) -> str:
        """The init_method URL once the launch knows the master port."""
        if self.job.spec.init.method is InitMethod.tcp:
            return f"tcp://{_url_host(self.master_addr)}:{port}"
        return self.init_method

    def host_env(self, host: Host) -> dict[str, str]:
        """Variables shared by every process of a host."""
        job = self.job
        env = {
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": self.master_port,
            "WORLD_SIZE": str(self.world_size),
            "GROUP_RANK": str(host.index),
            "NODE_RANK": str(host.index),
            "LOCAL_WORLD_SIZE": str(_processes_on(host, job)),
            "ROLE_WORLD_SIZE": str(self.world_size),
            "ROLE_NAME": "default",
        }
        if job.device is DeviceKind.cuda and job.spec.launcher.kind.value != "slurm":
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, host.gpus))
        if job.spec.backend.socket_ifname:
            env["GLOO_SOCKET_IFNAME"] = env["NCCL_SOCKET_IFNAME"] = job.spec.backend.socket_ifname
        env.update(job.spec.backend.env)
        return env

    def env(self, record: ProcessRecord) -> dict[str, str]:
        """The full torchrun-compatible environment of one process."""
        env = self.host_env(self.job.hosts[record.node_rank])
        env.update(RANK=str(record.global_rank), LOCAL_RANK=str(record.local_rank), ROLE_RANK=str(record.global_rank))
        return env


def _processes_on(host: Host, job: Job) -> int:
    return 1 if job.spec.parallel.mode is ParallelMode.dp else host.devices


def _records(job: Job) -> Iterator[ProcessRecord]:
    cuda = job.device is DeviceKind.cuda
    dp = job.spec.parallel.mode is ParallelMode.dp
    rank = 0
    for host in job.hosts:
        n = 1 if dp else host.devices
        label = host.label
        for local in range(n):
            if not cuda:
                device, ids = "cpu", ()
            elif dp:
                device, ids = "cuda:0", tuple(range(host.devices))
            else:
                device, ids = f"cuda:{local}", (local,)
            yield ProcessRecord(rank, local, host.index, n, label, device, ids)
            rank += 1


# Variables the runner owns: backend.env may not set them (validation says so).
RUNNER_VARIABLES = frozenset({
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "ROLE_RANK",
    "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES",
    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE",
})


def port_for(run_id: str) -> int:
    """A port all hosts can agree on without talking: derived from the run id, below Linux's ephemeral range."""
    return 20000 + zlib.crc32(run_id.encode()) % 10000


def _url_host(addr: str) -> str:
    return f"[{addr}]" if ":" in addr and not addr.startswith("<") else addr


def _master_port(job: Job, run: RunPaths | None) -> str:
    spec = job.spec
    if spec.init.master_port:
        return str(spec.init.master_port)
    kind = spec.launcher.kind.value
    if kind == "slurm":
        return Deferred.of("port derived from SLURM_JOB_ID")
    if kind == "mpi" or (kind == "manual" and len(job.hosts) > 1):
        # processes on other hosts cannot learn a port chosen here at launch: agree on one per run
        return str(port_for(run.run_id)) if run else Deferred.of("port derived from the run id")
    return Deferred.of("free port chosen at launch")


def make_plan(job: Job, run: RunPaths | None = None) -> Plan:
    """Expand a validated job into its process records (see the module docstring for the ranks).

    With ``run`` (the run's paths), run-specific values such as the rendezvous file are filled in.
    """
    spec = job.spec
    addr = job.master_addr if job.master_addr is not None else Deferred.of(_master_source(job))
    port = _master_port(job, run)
    if spec.init.method is InitMethod.env:
        url = "env://"
    elif spec.init.method is InitMethod.tcp:
        url = f"tcp://{_url_host(addr)}:{port}"  # Plan.init_url fills a deferred port
    else:
        path = run.rendezvous_file(spec.init.dir) if run else f"{spec.init.dir or Deferred.of('run folder')}/{Deferred.of('run id')}.rdzv/attempt0"
        url = f"file://{path}"
    return Plan(job, tuple(_records(job)), addr, port, url)


def _master_source(job: Job) -> str:
    kind = job.spec.launcher.kind.value
    return {
        "slurm": "first host of SLURM_STEP_NODELIST",
        "mpi": "host of MPI rank 0",
    }.get(kind, "host 0")
