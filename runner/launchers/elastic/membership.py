"""Which hosts each attempt of a job runs on, when hosts are lost (topology.min_nodes, topology.spares:
runner.spec.elastic).

A lost host ends the attempt everywhere (runner.launchers.elastic.rounds); the launch then starts the next
attempt on the hosts that remain, as a job of its own spec: the surviving hosts in their order, then the spares that
take the lost hosts' places, numbered again from 0 (so the first surviving host is host 0, serves the rendezvous and
holds the checkpoint every host kept: runner.training.context), with a port of the attempt's own. A lost host is kept
(``absent``): launcher=ssh tries it again, and one that answers is taken back at the next checkpoint, after the others,
while the job has fewer hosts than topology.max_nodes, and at most once per launcher.rejoin_after_s (each join is a
restart). Nothing here starts anything: :meth:`Membership.after_loss` and :meth:`Membership.after_return` are the
decisions, :meth:`Membership.spec` the next attempt's spec.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from runner.plan.processes import RunPort, port_for
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
    max_nodes: int = 0  # the most hosts the job grows back to (0: as many as it has)
    absent: tuple[HostConfig, ...] = ()  # hosts lost, in the order they were lost: they may come back
    joined_at: tuple[tuple[str, float], ...] = ()  # each host taken back, and when it last was (time.time())
    unready: tuple[HostConfig, ...] = ()  # spares that were not ready at the start: kept once they answer

    @classmethod
    def of(cls, spec: JobConfig) -> Membership:
        """The first attempt's: the pinned spec's hosts and spares."""
        hosts = tuple(spec.topology.hosts or ())
        return cls(hosts, tuple(spec.topology.spares or ()), spec.topology.min_nodes or len(hosts),
                   spec.topology.max_nodes or len(hosts))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(_name(h, i) for i, h in enumerate(self.hosts))

    def without_spares(self, gone: Iterable[str]) -> Membership:
        """These hosts, with the spares named in ``gone`` (found gone: launcher=manual's decision) no longer kept."""
        dropped = set(gone)
        return dataclasses.replace(self, spares=tuple(h for h in self.spares if host_key(h) not in dropped))

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
        absent = (*self.absent, *(h for i, h in enumerate(self.hosts) if i in gone))
        return GoesOn(dataclasses.replace(self, hosts=after, spares=self.spares[len(taken):], absent=absent), taken)

    @property
    def room(self) -> int:
        """How many hosts the job may take back (topology.max_nodes less the hosts it has)."""
        return max(0, (self.max_nodes or len(self.hosts)) - len(self.hosts))

    def returning(self, now: float, rejoin_after_s: float) -> tuple[Candidate, ...]:
        """The hosts to try while a round runs: the lost ones, each from when it may be taken back (``now``, or
        ``rejoin_after_s`` after it was last: launcher.rejoin_after_s), and the spares kept ready, where the job has
        room for them (topology.max_nodes above its hosts: a spare grows it); and the spares not ready at the start,
        which join where there is room and are kept ready where there is none."""
        last = dict(self.joined_at)
        lost = tuple(Candidate(h, max(now, last.get(host_key(h), -rejoin_after_s) + rejoin_after_s), joins=True)
                     for h in self.absent) if self.room else ()
        ready = tuple(Candidate(h, now, joins=True) for h in self.spares) if self.room else ()
        return (*lost, *ready, *(Candidate(h, now, joins=bool(self.room)) for h in self.unready))

    def with_unready(self, names: Iterable[str]) -> Membership:
        """These hosts with the spares named ``names`` not ready (they failed the check of the start)."""
        out = set(names)
        return dataclasses.replace(self, spares=tuple(h for h in self.spares if host_key(h) not in out),
                                   unready=(*self.unready, *(h for h in self.spares if host_key(h) in out)))

    def with_spares_ready(self, names: Iterable[str]) -> Membership:
        """These hosts with the spares named ``names``, not ready at the start, ready now: kept, after the others."""
        ready = set(names)
        return dataclasses.replace(self, spares=(*self.spares, *(h for h in self.unready if host_key(h) in ready)),
                                   unready=tuple(h for h in self.unready if host_key(h) not in ready))

    def with_arrivals(self, hosts: Iterable[HostConfig]) -> Membership:
        """These hosts, with ``hosts`` that arrived (launcher=manual: the spec does not list them) waiting to be
        taken in as a spare not ready at the start is: by :meth:`after_return`, never in a lost host's place."""
        known = {host_key(h) for h in (*self.hosts, *self.spares, *self.absent, *self.unready)}
        return dataclasses.replace(self, unready=(*self.unready, *(h for h in hosts if host_key(h) not in known)))

    def after_return(self, names: Iterable[str], now: float) -> GoesOn:
        """The hosts with those named ``names`` taken in (lost hosts back, spares), after the others, up to
        topology.max_nodes, in the order given: host 0 stays host 0, and holds the checkpoint."""
        waiting = (*self.absent, *self.spares, *self.unready)
        back = [h for name in names for h in waiting if host_key(h) == name][:self.room]
        back_names = {host_key(h) for h in back}
        joined = {**dict(self.joined_at), **{name: now for name in back_names}}
        def kept(hosts: tuple[HostConfig, ...]) -> tuple[HostConfig, ...]:
            return tuple(h for h in hosts if host_key(h) not in back_names)

        return GoesOn(dataclasses.replace(self, hosts=(*self.hosts, *back), absent=kept(self.absent),
                                          spares=kept(self.spares), unready=kept(self.unready),
                                          joined_at=tuple(joined.items())), (), tuple(back))

    def spec(self, spec: JobConfig, attempt: int) -> JobConfig:
        """``spec`` (the run's pinned one) for an attempt on these hosts: its topology these hosts and spares, and a
        rendezvous port of the attempt's own (the new host 0 may be the old one, whose last store has just closed)."""
        topology = dataclasses.replace(spec.topology, hosts=list(self.hosts), spares=list(self.spares), nodes=None,
                                       hostfile=None, min_nodes=min(self.min_nodes, len(self.hosts)), max_nodes=None)
        init = spec.init if attempt == 0 else dataclasses.replace(
            spec.init, master_port=port_for(spec.run_id or "", RunPort.ATTEMPTS + attempt))
        return dataclasses.replace(spec, topology=topology, init=init)


@dataclass(frozen=True)
class Candidate:
    """A host tried while a round runs: from ``due`` on (time.time()); ``joins``: the round stops at a checkpoint to
    take it in once it answers (else it is only kept ready: a spare, where the job has its most hosts)."""

    host: HostConfig
    due: float
    joins: bool = True


@dataclass(frozen=True)
class GoesOn:
    """The job after a loss or a return: on ``membership``'s hosts (the survivors, then spares, then hosts taken back),
    ``taken`` the spares that took the lost hosts' places, ``back`` the lost hosts taken back."""

    membership: Membership
    taken: tuple[HostConfig, ...]
    back: tuple[HostConfig, ...] = ()  # lost hosts taken back


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


def host_key(host: HostConfig) -> str:
    """How a change of membership names a host of the spec: its name, else its address (the rounds' records, the
    launches' tries of lost hosts and spares, etcd's decisions)."""
    return host.name or str(host.addr)


def _name(host: HostConfig, index: int) -> str:
    """:func:`host_key`, or ``node<index>`` for a host of neither name nor address."""
    return host_key(host) if host.name or host.addr else f"node{index}"
