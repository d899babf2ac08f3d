"""A job that outlives its hosts: ``topology.min_nodes`` (the fewest hosts it goes on with) and ``topology.spares``
(hosts kept ready to take a lost one's place), checked before anything starts.

A lost host ends the attempt on every host; the launch starts the next one on the hosts that remain (and a spare in
the lost one's stead), from the last checkpoint, with the ranks numbered again in the hosts' order: the surviving
hosts first, as the spec lists them, then the spares taken (runner.launchers.elastic.membership). The global batch is
kept at every world size the job runs at, split exactly over the processes that remain (runner.spec.batch): nothing
about it needs checking here beyond the full world size, which validation checks.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from runner.spec.job import Job
from runner.spec.problems import Problem
from runner.spec.schema import HostConfig, JobConfig, ParallelMode, TopologyConfig
from runner.spec.topology import Host, is_valid_host

class ElasticFacts(Protocol):
    """What these rules read of a launcher's capabilities (runner.launchers.capabilities.Capabilities)."""

    @property
    def survives_lost_hosts(self) -> bool: ...  # topology.min_nodes and spares work with it
    @property
    def lost_host_reason(self) -> str: ...  # why they do not, when they do not
    @property
    def takes_hosts_back(self) -> bool: ...  # a lost host that answers again joins (topology.max_nodes)
    @property
    def hosts_back_reason(self) -> str: ...  # why not, when not
    @property
    def takes_arrivals(self) -> bool: ...  # a host the spec does not list may arrive (topology.max_nodes beyond)


@dataclass(frozen=True)
class Elasticity:
    """How a job meets a lost host: ``min_nodes`` of its hosts must remain, ``spares`` take lost ones' places."""

    hosts: int  # the spec's
    min_nodes: int
    spares: tuple[Host, ...]

    @property
    def enabled(self) -> bool:
        """A lost host is survived (else it ends the job, as without these options)."""
        return self.min_nodes < self.hosts or bool(self.spares)

    def line(self) -> str:
        """The dry run's words: "a lost host: the job restarts on the remaining (at least 2 of 3 hosts; spare: d)"."""
        if not self.enabled:
            return "a lost host ends the job (topology.min_nodes: every host)"
        spares = f"; spare(s) kept ready: {', '.join(h.label for h in self.spares)}" if self.spares else ""
        return (f"a lost host ends the attempt; the job restarts from the last checkpoint on the hosts that remain, "
                f"while at least {self.min_nodes} of {self.hosts} do (topology.min_nodes){spares}")


def declares_elasticity(spec: JobConfig) -> bool:
    """The spec says how the job meets a lost host (topology.min_nodes, even at every host, or spares): its launch runs
    it in rounds where the launcher does (the last round of a job that lost hosts has min_nodes = its hosts)."""
    return spec.topology.min_nodes is not None or bool(spec.topology.spares)


def keeps_checkpoints_on_every_host(spec: JobConfig) -> bool:
    """The job may lose host 0 and go on: every host keeps the last checkpoint (runner.training.copies), from the
    first attempt to the last (at its fewest hosts too: a relaunch of the run id resumes from the newest copy any host
    holds)."""
    return declares_elasticity(spec)


def elasticity(job: Job) -> Elasticity:
    topology = job.spec.topology
    return Elasticity(hosts=len(job.hosts), min_nodes=topology.min_nodes or len(job.hosts), spares=job.spares)


def resolve_spares(cfg: TopologyConfig, hosts: tuple[Host, ...], problems: list[Problem]) -> tuple[Host, ...]:
    """``topology.spares`` as hosts (numbered after the spec's), each with a name to log in to and the devices of
    the hosts whose place it may take; problems appended."""
    spares: list[Host] = []
    taken = {h.reach for h in hosts if h.reach is not None}
    counts = {h.devices for h in hosts}
    for i, spare in enumerate(cfg.spares or []):
        key = f"topology.spares[{i}]"
        found = _spare(key, spare, cfg.devices_per_node, counts, taken, problems)
        if found is not None:
            spares.append(Host(index=len(hosts) + i, name=spare.name, addr=spare.addr, devices=found,
                               gpus=tuple(spare.gpus) if spare.gpus is not None else tuple(range(found))))
            taken.add(spare.addr or spare.name)
    return tuple(spares)


def _spare(key: str, spare: HostConfig, per_node: int | None, counts: set[int], taken: set[str],
           problems: list[Problem]) -> int | None:
    """One spare's device count, or None with its problem appended."""
    if not spare.name:
        problems.append(Problem(f"{key}.name", "not set: a spare is a machine the launch logs in to",
                                f"name it: '{key}={{name: gpu-d}}'"))
        return None
    for field_name in ("name", "addr"):
        value = getattr(spare, field_name)
        if value is not None and not is_valid_host(value):
            problems.append(Problem(f"{key}.{field_name}", f"{value!r} is not a host name or IP address",
                                    "letters, digits, '-', '_' and '.', or an IPv4/IPv6 literal"))
            return None
    if (spare.addr or spare.name) in taken:
        problems.append(Problem(key, f"{spare.addr or spare.name!r} is already one of the job's hosts or spares",
                                "a spare is a machine of its own, kept ready"))
        return None
    devices = spare.devices if spare.devices is not None else per_node if per_node is not None else \
        next(iter(counts)) if len(counts) == 1 else None
    if devices is None or devices < 1 or (counts and devices != max(counts)) or len(counts) > 1:
        hosts = "+".join(map(str, sorted(counts)))
        problems.append(Problem(f"{key}.devices", f"{devices}: a spare takes any lost host's place, so it needs the "
                                                  f"devices every host has, but the hosts have {hosts}",
                                "hosts of one size, and spares of that size"))
        return None
    return devices


def world_size_range(job: Job, elastic: Elasticity) -> tuple[int, int]:
    """The smallest and the largest world size the job may run at (one process per host under DP): its own, and, at
    the fewest hosts, its ``min_nodes`` smallest hosts with a spare in each lost host's place while spares last
    (spares have the hosts' size: :func:`resolve_spares`). By arithmetic, for any number of hosts."""
    per_host = sorted(1 if job.spec.parallel.mode is ParallelMode.dp else h.devices for h in job.hosts)
    largest = sum(per_host)
    if not elastic.enabled:
        return largest, largest
    filled = min(len(per_host) - elastic.min_nodes, len(elastic.spares))
    return sum(per_host[:elastic.min_nodes]) + filled * per_host[-1], largest


def elastic_problems(job: Job, can: ElasticFacts) -> Iterator[Problem]:
    """``topology.min_nodes``, ``topology.spares`` and ``topology.max_nodes`` against the hosts, the launcher (``can``:
    whether it survives a lost host and takes one back, and why not), the restarts and the master."""
    topology, launcher = job.spec.topology, job.spec.launcher
    n = len(job.hosts)
    yield from _max_nodes_problems(job, can)
    if topology.min_nodes is not None and not 1 <= topology.min_nodes <= n:
        yield Problem("topology.min_nodes", f"must be 1..{n} (the topology has {n} host(s)), got {topology.min_nodes}",
                      f"e.g. topology.min_nodes={max(1, n - 1)}: the job goes on while one host is lost; null: every "
                      f"host")
        return
    elastic = elasticity(job)
    if not elastic.enabled:
        return
    what = f"topology.min_nodes={elastic.min_nodes}" if elastic.min_nodes < n else "topology.spares"
    key = "topology.min_nodes" if elastic.min_nodes < n else "topology.spares"
    if not can.survives_lost_hosts:
        yield Problem(key, f"launcher={launcher.kind}: {can.lost_host_reason}", "launcher=ssh, where `run` starts every host's share "
                                                                  "and starts the job again on the hosts that remain")
        return
    if launcher.max_restarts < 1:
        yield Problem("launcher.max_restarts", f"0 with {what}: a lost host restarts the job, and every change of its "
                                               f"hosts counts as a restart",
                      "launcher.max_restarts=3, or leave topology.min_nodes and topology.spares unset")
    if job.spec.init.master_addr is not None:
        yield Problem("init.master_addr", f"{job.spec.init.master_addr!r} with {what}: host 0 may be lost, and the "
                                          f"next attempt's master is the next host 0",
                      "leave init.master_addr unset (the master is host 0's address)")


def _max_nodes_problems(job: Job, can: ElasticFacts) -> Iterator[Problem]:
    """``topology.max_nodes``: the hosts the job grows back to are the spec's and its spares (the machines the launch
    knows; under a launcher that takes hosts that arrive, any number more), under a launcher that takes hosts
    back."""
    topology, n = job.spec.topology, len(job.hosts)
    if topology.max_nodes is None:
        return
    most = n + len(job.spares)
    if not n <= topology.max_nodes <= (topology.max_nodes if can.takes_arrivals else most):
        spares = f" + {len(job.spares)} spare(s)" if job.spares else ""
        yield Problem("topology.max_nodes", f"must be {n}..{most} (the topology has {n} host(s){spares}), got "
                                            f"{topology.max_nodes}",
                      "the job grows back to its hosts, and to its spares beyond them: list more spares for more; "
                      "null: the spec's hosts")
    elif not can.takes_hosts_back:
        yield Problem("topology.max_nodes", f"launcher={job.spec.launcher.kind}: {can.hosts_back_reason}",
                      "launcher=ssh, where `run` tries the lost hosts again and takes back those that answer; or "
                      "leave topology.max_nodes unset")
    elif topology.min_nodes is None and not job.spares:
        yield Problem("topology.max_nodes", f"{topology.max_nodes} without topology.min_nodes or topology.spares: a "
                                            f"lost host ends the job, so none comes back",
                      f"topology.min_nodes={max(1, n - 1)} as well: the job goes on without a lost host, and takes "
                      f"it back at a checkpoint once it answers")
