"""Which hosts each attempt of a job runs on, when hosts are lost (topology.min_nodes, topology.spares:
runner.spec.elastic).

A lost host ends the attempt everywhere (runner.launchers.elastic.rounds); the launch then starts the next
attempt on the hosts that remain, as a job of its own spec: the surviving hosts in their order, then the spares that
take the lost hosts' places, numbered again from 0 (so the first surviving host is host 0, serves the rendezvous and
holds the checkpoint every host kept: runner.training.context), with a port of the attempt's own. Nothing here starts
anything: :meth:`Membership.after_loss` is the decision, :meth:`Membership.spec` the next attempt's spec.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from runner.plan.processes import port_for
from runner.spec.elastic import resolve_spares
from runner.spec.job import Job
from runner.spec.problems import Problem
from runner.spec.schema import HostConfig, JobConfig
from runner.spec.topology import resolve_hosts


@dataclass(frozen=True)
class Membership:
    """The hosts an attempt runs on (in node-rank order), the spares still kept ready, and the fewest hosts the job
    goes on with."""

    hosts: tuple[HostConfig, ...]
    spares: tuple[HostConfig, ...]
    min_nodes: int

    @classmethod
    def of(cls, spec: JobConfig) -> Membership:
        """The first attempt's: the pinned spec's hosts and spares."""
        hosts = tuple(spec.topology.hosts or ())
        return cls(hosts, tuple(spec.topology.spares or ()), spec.topology.min_nodes or len(hosts))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(_name(h, i) for i, h in enumerate(self.hosts))

    def without_spares(self, gone: Iterable[str]) -> Membership:
        """These hosts, with the spares named in ``gone`` (found gone: launcher=manual's decision) no longer kept."""
        dropped = set(gone)
        return dataclasses.replace(self, spares=tuple(h for h in self.spares if _name(h, -1) not in dropped))

    def after_loss(self, lost: Iterable[int]) -> GoesOn | CannotGoOn:
        """The hosts after losing those at indices ``lost``, and the spares that took their places; or why the job
        cannot go on (fewer than topology.min_nodes hosts left)."""
        gone = set(lost)
        survivors = tuple(h for i, h in enumerate(self.hosts) if i not in gone)
        taken = self.spares[:len(self.hosts) - len(survivors)]
        after = (*survivors, *taken)
        if len(after) < self.min_nodes:
            no_spare = "" if self.spares[len(taken):] or not gone else " (no spare left)"
            return CannotGoOn(f"{len(after)} host(s) left of {len(self.hosts)}, fewer than topology.min_nodes="
                              f"{self.min_nodes}{no_spare}")
        return GoesOn(Membership(after, self.spares[len(taken):], self.min_nodes), taken)

    def spec(self, spec: JobConfig, attempt: int) -> JobConfig:
        """``spec`` (the run's pinned one) for an attempt on these hosts: its topology these hosts and spares, and a
        rendezvous port of the attempt's own (the new host 0 may be the old one, whose last store has just closed)."""
        topology = dataclasses.replace(spec.topology, hosts=list(self.hosts), spares=list(self.spares), nodes=None,
                                       hostfile=None, min_nodes=min(self.min_nodes, len(self.hosts)))
        init = spec.init if attempt == 0 else dataclasses.replace(spec.init,
                                                                   master_port=port_for(f"{spec.run_id}.{attempt}"))
        return dataclasses.replace(spec, topology=topology, init=init)


@dataclass(frozen=True)
class GoesOn:
    """The job after a loss: on ``membership``'s hosts (the survivors, then spares), ``taken`` the spares that took the
    lost hosts' places."""

    membership: Membership
    taken: tuple[HostConfig, ...]


@dataclass(frozen=True)
class CannotGoOn:
    """Why the job cannot go on after a loss: fewer than topology.min_nodes hosts left."""

    why: str


def job_on(job: Job, spec: JobConfig) -> Job:
    """``job`` as an attempt's ``spec`` (:meth:`Membership.spec`) has it: its hosts and spares resolved again.
    Raises ValueError where they do not resolve."""
    problems: list[Problem] = []
    hosts = resolve_hosts(spec.topology, problems)
    if problems:
        raise ValueError("; ".join(p.render() for p in problems))
    return dataclasses.replace(job, spec=spec, hosts=hosts, spares=resolve_spares(spec.topology, hosts, []))


def _name(host: HostConfig, index: int) -> str:
    return host.name or host.addr or f"node{index}"
