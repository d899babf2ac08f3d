"""The plan: one place per process (runner.spec.place.RankPlace), from a validated job, by a pure function.

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
:class:`Deferred`: strings that say where the value will come from. What depends on the launcher (the
master port's policy, the stop signal, who sets CUDA_VISIBLE_DEVICES) comes in as :class:`LaunchRules`,
which each launcher class gives (runner.launchers).
"""

from __future__ import annotations

import signal
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum
from functools import cached_property
from itertools import accumulate
from pathlib import Path

from runner.records.paths import RunPaths
from runner.spec.job import Job
from runner.spec.place import RankPlace
from runner.spec.schema import DeviceKind, InitMethod, ParallelMode
from runner.spec.topology import Host


class Deferred(str):
    """A value fixed at launch; its text says by whom, e.g. ``<free port chosen at launch>``."""

    @classmethod
    def of(cls, source: str) -> "Deferred":
        return cls(f"<{source}>")


@dataclass(frozen=True, kw_only=True)
class LaunchRules:
    """What the job's launcher decides about its plan (each launcher class says: runner.launchers)."""

    master_port: str  # a port, or Deferred (a free port chosen at launch, one derived from the Slurm job id)
    master_source: str  # who the master is when the spec leaves it to the launch ("host 0", Slurm's first node)
    stop_signal: signal.Signals  # asks the ranks to checkpoint and stop (ctx.should_stop)
    sets_visible_devices: bool = True  # CUDA_VISIBLE_DEVICES from topology.hosts[].gpus (Slurm sets its own)
    hosts_start_apart: bool = False  # each host's share is started by its own `run`, by hand (launcher=manual)
    tasks_end_together: bool = False  # the scheduler kills every task once one has ended badly (mpirun): the tasks
    # end an attempt together, once host 0 has reported it


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A job's processes: one place per process, and what every process of it shares (the master, the init URL,
    its launcher's rules). Made by :func:`make_plan`."""

    job: Job
    records: tuple[RankPlace, ...]  # in global rank order
    master_addr: str
    master_port: str
    init_method: str  # the init_method URL every process passes to init_process_group
    rules: LaunchRules

    @property
    def world_size(self) -> int:
        return len(self.records)

    @property
    def master_known(self) -> bool:
        """Whether the master's address and port are known here: neither is left to the launch (Deferred), so a
        process that is no rank of the run (`run`, an ssh host's check) can dial host 0's store."""
        return not isinstance(self.master_addr, Deferred) and not isinstance(self.master_port, Deferred)

    def host_records(self, node_rank: int) -> tuple[RankPlace, ...]:
        """The places of one host: a contiguous block, found by the rank prefix sums."""
        start = self._host_starts[node_rank]
        return self.records[start:start + self.processes_per_host[node_rank]]

    @cached_property
    def processes_per_host(self) -> tuple[int, ...]:
        """How many processes each host runs, in host order (the one place this is counted)."""
        return tuple(_processes_on(h, self.job) for h in self.job.hosts)

    @cached_property
    def _host_starts(self) -> list[int]:
        return [0, *accumulate(self.processes_per_host)]

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
            "GROUP_WORLD_SIZE": str(len(job.hosts)),
            "NODE_RANK": str(host.index),
            "LOCAL_WORLD_SIZE": str(_processes_on(host, job)),
            "ROLE_WORLD_SIZE": str(self.world_size),
            "ROLE_NAME": "default",
        }
        if job.device is DeviceKind.cuda and self.rules.sets_visible_devices:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, host.gpus))
        if job.spec.backend.socket_ifname:
            env["GLOO_SOCKET_IFNAME"] = env["NCCL_SOCKET_IFNAME"] = job.spec.backend.socket_ifname
        env.update(job.spec.backend.env)
        return env

    def env(self, place: RankPlace) -> dict[str, str]:
        """The full torchrun-compatible environment of one process."""
        env = self.host_env(self.job.hosts[place.node_rank])
        env.update(RANK=str(place.global_rank), LOCAL_RANK=str(place.local_rank), ROLE_RANK=str(place.global_rank))
        return env


def _processes_on(host: Host, job: Job) -> int:
    return 1 if job.spec.parallel.mode is ParallelMode.dp else host.devices


def _records(job: Job) -> Iterator[RankPlace]:
    cuda = job.device is DeviceKind.cuda
    dp = job.spec.parallel.mode is ParallelMode.dp
    world = job.world_size
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
            yield RankPlace(global_rank=rank, local_rank=local, node_rank=host.index, world_size=world,
                            local_world_size=n, host=label, device=device, device_ids=ids)
            rank += 1


PORT_BAND = (20000, 10000)  # derived ports: 20000..29999, below Linux's ephemeral range


def derived_port(key: int) -> int:
    """A port every host can agree on without talking, from a number they all know (a job id, a hash)."""
    start, size = PORT_BAND
    return start + key % size


class RunPort(IntEnum):
    """What a port derived from a run id is for. A run's ports are consecutive in the band (wrapping at its end), so
    two uses of one run never get the same port, as two hashes of the run id could (run l32225b2c's etcd clients and
    peers did: its members could not start)."""

    MASTER = 0  # the rendezvous of the first attempt (launcher=manual, mpi)
    ETCD_CLIENTS = 1  # the job's own etcd (launcher=manual)
    ETCD_PEERS = 2
    ATTEMPTS = 3  # attempt n's rendezvous is ATTEMPTS + n (n >= 1: a new host 0 may be the old one)


def port_for(run_id: str, use: int = RunPort.MASTER) -> int:
    """The port for ``use`` (a :class:`RunPort`, or ``RunPort.ATTEMPTS + n``) of a run whose hosts agree on it
    through its run id."""
    return derived_port(zlib.crc32(run_id.encode()) + use)


def _url_host(addr: str) -> str:
    return f"[{addr}]" if ":" in addr and not addr.startswith("<") else addr


def make_plan(job: Job, rules: LaunchRules, run: RunPaths | None = None) -> Plan:
    """Expand a validated job into its processes' places (see the module docstring for the ranks), under
    its launcher's ``rules``. With ``run`` (the run's paths), run-specific values such as the rendezvous
    file are filled in.
    """
    spec = job.spec
    addr = job.master_addr if job.master_addr is not None else Deferred.of(rules.master_source)
    port = str(spec.init.master_port) if spec.init.master_port else rules.master_port
    if spec.init.method is InitMethod.env:
        url = "env://"
    elif spec.init.method is InitMethod.tcp:
        url = f"tcp://{_url_host(addr)}:{port}"  # Plan.init_url fills a deferred port
    else:
        named = run or RunPaths(Path(Deferred.of("run folder")), Deferred.of("run id"))  # a plan without a run: its names
        url = f"file://{named.rendezvous_file(spec.init.dir)}"
    return Plan(job=job, records=tuple(_records(job)), master_addr=addr, master_port=port, init_method=url, rules=rules)
