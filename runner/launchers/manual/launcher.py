"""launcher=manual: one `run` command per host, typed by hand on each host.

Each command repeats the user's overrides and pins what the hosts must agree on (run id, master
port: the launch's pins, from the pinned spec), plus the host it is for; run on that host, it starts that
host's share like launcher=local. With topology.min_nodes or topology.spares, each host's `run` runs its rounds: the
job goes on without a lost host, the hosts deciding who goes on in etcd (runner.launchers.manual.rounds,
runner.launchers.elastic.decisions): the user's (launcher.manual.etcd), or the job's own, a member on every host.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from runner.common import exits
from runner.common.signals import handling
from runner.launchers.base import AgentRuns, Launcher, LaunchOutcome, LaunchRequest, named_hosts_problems
from runner.launchers.capabilities import Capabilities
from runner.launchers.elastic.decisions import AlreadyRunning, Decider
from runner.launchers.elastic.etcd import Etcd, EtcdError
from runner.launchers.elastic.etcd_member import ETCD, READY_S, MemberRefused, OwnCluster, OwnMember, member_start
from runner.launchers.elastic.membership import Candidate, Membership, host_key, job_on
from runner.launchers.elastic.rounds import AttemptsOnHosts, Ended, Returns
from runner.launchers.manual.commands import host_commands, rounds_said
from runner.launchers.manual.joins import EtcdReturns
from runner.launchers.manual.rounds import HostRound, NotCalled, arrivals_of, come_back, run_round, stand_by
from runner.plan.processes import Deferred, port_for
from runner.records.paths import RunPaths
from runner.spec.job import Job
from runner.spec.elastic import elasticity
from runner.spec.probe import LocalProbe, MachineProbe
from runner.spec.problems import Problem
from runner.spec.schema import HostConfig, InitMethod, JobConfig
from runner.spec.topology import is_loopback, is_valid_host
from runner.worker.agent_reports import AgentReport
from runner.worker.share import hard_stop_s
from runner.worker.zygote import Zygote

def hosts_apart_problems(job: Job, launcher: str) -> Iterator[Problem]:
    """The rules of a job whose every host's share is run by a `run` of its own (manual, ssh): each host named, host
    0's address known, and a store to restart together through."""
    spec, hosts = job.spec, job.hosts
    yield from named_hosts_problems(job, launcher)
    if len(hosts) > 1 and job.master_addr is None and spec.init.method is not InitMethod.file:
        yield Problem("init.master_addr", f"{launcher} launch on several hosts needs to know host 0's address",
                      "name host 0 (topology.hosts[0].name=...) or set init.master_addr")
    if spec.launcher.max_restarts and len(hosts) > 1 and spec.init.method is InitMethod.file:
        yield Problem("launcher.max_restarts", "several hosts restart together by agreeing through host 0's "
                      "rendezvous store, but init=file has none",
                      "init=tcp or init=env with launcher.max_restarts (or restart the launch yourself: the recipe "
                      "resumes from its last checkpoint with the same run_id)")


def agreed_port(job: Job, paths: RunPaths | None) -> str:
    """The master port of a job on several hosts whose `run`s cannot learn a port chosen on one of them at launch:
    one per run, derived from the run id."""
    return str(port_for(paths.run_id)) if paths else Deferred.of("port derived from the run id")


class NotOneHost(Exception):
    """No host of the job, or several, is this machine (ManualLauncher.this_host); the message says which, and the
    way out."""


class ManualLauncher(Launcher):
    name = "manual"
    capabilities = Capabilities(
        supports_restarts=True,  # the hosts restart together, agreeing through host 0's store (runner.worker.channel)
        shares_run_folder=False,  # each host's `run` makes its own run folder
        survives_lost_hosts=True,  # the hosts' `run`s decide who goes on in etcd (runner.launchers.manual.rounds)
        takes_hosts_back=True,  # a lost host's `run` started again, or a spare, joins at a checkpoint (manual.joins)
        takes_arrivals=True,  # a host the spec does not list (launcher.manual.host=<its name>) joins the same way
        forks_here=True,
        hosts_start_apart=True,
        pins_master_port=True)  # the hosts cannot learn a port chosen on one of them at launch

    def __init__(self, **launch: Any) -> None:
        super().__init__(**launch)
        self._round: HostRound | None = None  # this host's round, once it runs rounds (a job that outlives its hosts)
        self._listed: Job | None = None  # a host that arrives: the job as the spec lists it (its machines run the
        # job's own etcd, of which this host is a client)

    @classmethod
    def job_problems(cls, job: Job, probe: MachineProbe) -> Iterator[Problem]:
        yield from hosts_apart_problems(job, cls.name)
        yield from _etcd_problems(job, probe)
        spec, hosts = job.spec, job.hosts
        chosen = spec.launcher.manual.host
        if chosen is None:
            return
        every = (*hosts, *job.spares)
        if chosen.isascii() and chosen.isdigit():
            if int(chosen) >= len(every):
                spares = f" and {len(job.spares)} spare(s)" if job.spares else ""
                yield Problem("launcher.manual.host", f"index {chosen} is past the last host (the topology has "
                                                      f"{len(hosts)}{spares}: 0..{len(every) - 1})",
                              "an index from 0, or this host's name or address")
        elif not any(chosen in (h.name, h.addr) for h in every):
            yield from _arrival_problems(job, chosen)
            return
        if spec.launcher.manual.addr is not None:
            yield Problem("launcher.manual.addr", f"{spec.launcher.manual.addr!r} for {chosen!r}, a machine the spec "
                                                  f"lists: its address is the spec's",
                          "leave launcher.manual.addr unset (it is for a host that arrives, one the spec does not "
                          "list), or set the address in topology.hosts")

    @classmethod
    def spec_problems(cls, spec: JobConfig) -> Iterator[Problem]:
        yield from super().spec_problems(spec)
        if spec.launcher.manual.keepalive_s < 1:
            yield Problem("launcher.manual.keepalive_s", f"must be 1 or more (seconds between a host's keepalives in "
                                                         f"the job's etcd), got {spec.launcher.manual.keepalive_s}",
                          "launcher.manual.keepalive_s=2 (the default): a host silent for 8 s is lost")
        for i, endpoint in enumerate(spec.launcher.manual.etcd or ()):
            host, _, port = str(endpoint).rpartition(":")
            if not (host and is_valid_host(host.strip("[]")) and port.isdigit() and 0 < int(port) < 65536):
                yield Problem(f"launcher.manual.etcd[{i}]", f"{endpoint!r} is not host:port",
                              "an etcd member's client address, e.g. launcher.manual.etcd=[10.0.0.5:2379]")

    @classmethod
    def agent_runs(cls, job: Job) -> AgentRuns:
        """A job that outlives its hosts runs its rounds in the agent (each a HostAgent of its own, every round's
        ranks forked from the agent's zygote, which has tried the recipe target meanwhile), not only a share."""
        return AgentRuns.launch if elasticity(job).enabled else AgentRuns.share

    @classmethod
    def master_port(cls, job: Job, paths: RunPaths | None) -> str:
        return agreed_port(job, paths) if len(job.hosts) > 1 else super().master_port(job, paths)

    def request(self) -> LaunchRequest:
        return LaunchRequest(launcher=self.name, commands=(*host_commands(self.plan, self.invocation),
                                                           *rounds_said(self.plan.job)))

    def this_host(self, names: frozenset[str]) -> int:
        """This machine's node rank (a spare's index follows the hosts'): launcher.manual.host, else the one host
        whose name/address is ours. Raises NotOneHost where no host, or several, are ours."""
        hosts = (*self.plan.job.hosts, *self.plan.job.spares)
        chosen = self.plan.job.spec.launcher.manual.host
        if chosen is not None:
            return int(chosen) if chosen.isascii() and chosen.isdigit() else next(h.index for h in hosts if chosen in (h.name, h.addr))
        if len(hosts) == 1:
            return 0
        mine = [h.index for h in hosts if any(v in names and not is_loopback(v) for v in (h.name, h.addr) if v)]
        if len(mine) == 1:
            return mine[0]
        found = "several hosts match" if mine else "no host matches"
        raise NotOneHost(f"{found} this machine ({', '.join(sorted(n for n in names if not is_loopback(n))[:6])}); "
                         f"hint: add launcher.manual.host=<index> (the dry run prints each host's command)")

    def launch(self, request: LaunchRequest) -> LaunchOutcome:
        arriving = self._arriving()
        if arriving is not None:  # a host the spec does not list: the job's last spare, as far as this host goes
            job = arriving.plan.job
            return arriving._rounds(len(job.hosts) + len(job.spares) - 1)
        try:
            node = self.this_host(LocalProbe().host_names())
        except NotOneHost as e:
            print(f"error: launcher.manual.host: {e}", file=sys.stderr)
            return LaunchOutcome(code=exits.INVALID)
        if elasticity(self.plan.job).enabled:
            return self._rounds(node)
        return LaunchOutcome(code=self.run_host(node))

    def _arriving(self) -> ManualLauncher | None:
        """Where launcher.manual.host names a host the spec does not list (it arrives: validation let it, the job
        having room up to topology.max_nodes), this launch with that host as the job's last spare (its devices the
        hosts'); None: this machine is one the spec lists."""
        job, manual = self.plan.job, self.plan.job.spec.launcher.manual
        chosen = manual.host
        if chosen is None or (chosen.isascii() and chosen.isdigit()) or \
                any(chosen in (h.name, h.addr) for h in (*job.hosts, *job.spares)):
            return None
        host = HostConfig(name=chosen, addr=manual.addr, devices=max(h.devices for h in job.hosts))
        spec = dataclasses.replace(job.spec, topology=dataclasses.replace(
            job.spec.topology, spares=[*job.spec.topology.spares, host]))
        arriving = ManualLauncher(plan=self.plan_for(job_on(job, spec), self.paths), paths=self.paths,
                                  invocation=self.invocation, environment=self.environment, zygote=self.zygote)
        arriving._listed = job
        return arriving

    # -- a job that outlives its hosts: this host's rounds (runner.launchers.elastic.rounds) ----------------------
    def _rounds(self, node: int) -> LaunchOutcome:
        job, spec = self.plan.job, self.plan.job.spec
        machines = (*job.hosts, *job.spares)
        member = None
        stopped: list[int] = []
        try:
            with handling((signal.SIGINT, signal.SIGTERM), lambda signum, _frame: stopped.append(signum)):
                try:
                    endpoints, member = self._etcd(node)
                except MemberRefused as e:
                    print(f"error: launcher=manual: {e}", file=sys.stderr)
                    return LaunchOutcome(code=exits.FAILED, cause=str(e))
                me = machines[node]
                decider = Decider(Etcd(endpoints), self.paths.run_id, me.label,
                                  "host" if node < len(job.hosts) else "spare", spec.launcher.manual.keepalive_s,
                                  arrives=None if self._listed is None else HostConfig(
                                      name=me.name, addr=me.addr, devices=me.devices))
                refused = self._join(decider, member, stopped)
                if refused is not None:
                    return refused
                zygote = self.zygote() if self.zygote is not None else Zygote.start()
                self._round = HostRound(plan=self.plan, paths=self.paths, environment=self.environment,
                                        decider=decider, zygote=zygote, node=node,
                                        max_nodes=Membership.of(spec).max_nodes, stopped=stopped)
                try:
                    if node < len(job.hosts) and self._returning(decider):
                        decider.become("returning")
                    outcome = self._stand_by() if decider.role != "host" else AttemptsOnHosts(self).run()
                    while self._round.left_out and not stopped:  # the others went on without it: it comes back
                        self._round.left_out.clear()
                        if not come_back(decider, stopped, decider.lost_after_s + hard_stop_s(spec.launcher)):
                            return outcome
                        outcome = self._stand_by()
                    return outcome
                finally:
                    if self.zygote is None:  # its own (one given is its giver's to close)
                        zygote.close()
                    decider.leave()
                    if member is not None:
                        _linger(decider, self._round.come_s())
        finally:
            if member is not None:
                member.stop()

    def _returning(self, decider: Decider) -> bool:
        """This host's `run` was started again while the job runs (its ranks began an attempt of this launch), as
        etcd says within init.timeout_s (else it starts as at the start: a rendezvous without it fails, and says so)."""
        deadline = time.monotonic() + self.plan.job.spec.init.timeout_s
        while True:
            try:
                return decider.has_begun()
            except EtcdError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(READY_S)

    def _etcd(self, node: int) -> tuple[list[str], OwnMember | None]:
        """Where this host's decisions are made: the user's etcd, or the job's own, whose member here it starts."""
        job = self.plan.job
        if job.spec.launcher.manual.etcd:
            return list(job.spec.launcher.manual.etcd), None
        if self._listed is not None:  # a host that arrives: a client of the members the spec's machines run
            cluster = OwnCluster.of(self._listed)
            print(f"manual: host {job.spares[-1].label} arrives (the spec does not list it): a client of the job's "
                  f"etcd ({cluster.size} members) on port {cluster.client_port}", file=sys.stderr, flush=True)
            return cluster.endpoints, None
        cluster = OwnCluster.of(job)
        state = member_start(cluster, node, job.spec.init.timeout_s)  # (raises MemberRefused)
        member = OwnMember(cluster, node, self.paths.root / "etcd.log", state)
        again = ", joining the running cluster again: its earlier member removed, this one added" \
            if state == "existing" else ""
        print(f"manual: this host's member of the job's etcd ({cluster.names[node]}, {cluster.size} members) on port "
              f"{cluster.client_port}{again}", file=sys.stderr, flush=True)
        return cluster.endpoints_from(node), member

    def _join(self, decider: Decider, member: OwnMember | None, stopped: list[int]) -> LaunchOutcome | None:
        """This host in the job's etcd, once a majority of its members is up (within init.timeout_s: the hosts are
        started by hand); refused: why not."""
        timeout_s = self.plan.job.spec.init.timeout_s
        if member is not None:
            why = member.serving(timeout_s)
            if why is not None:
                print(f"error: launcher=manual: {why}", file=sys.stderr)
                return LaunchOutcome(code=exits.FAILED, cause=why)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                decider.join()
                return None
            except AlreadyRunning as e:
                print(f"error: launcher=manual: {e}", file=sys.stderr)
                return LaunchOutcome(code=exits.FAILED, cause=str(e))
            except EtcdError as e:
                if stopped or time.monotonic() > deadline:
                    why = f"the job's etcd ({', '.join(decider.etcd.endpoints)}) did not answer: {e}"
                    print(f"error: launcher=manual: {why}", file=sys.stderr)
                    return LaunchOutcome(code=exits.from_signal(stopped[0]) if stopped else exits.FAILED, cause=why)
                time.sleep(1.0)

    def _stand_by(self) -> LaunchOutcome:
        """A spare's `run`, a lost host's started again, or a host's left out while its `run` lived on: ready until a
        decision takes it in (then its rounds, from that attempt, as a host), or until the job ends without it."""
        assert self._round is not None
        this, spec = self._round, self.plan.job.spec
        try:
            passed = frozenset(d.attempt for d in this.decider.decisions())
        except EtcdError:
            passed = frozenset()
        called = stand_by(this.decider, this.stopped, spec.init.timeout_s, passed)
        said = "spare" if this.decider.role == "spare" else "host"
        if isinstance(called, NotCalled):
            print(f"manual: {said} {this.decider.label}: {called.why}", file=sys.stderr, flush=True)
            if this.decider.out is not None and this.decider.role == "returning" and not this.stopped:
                this.left_out.append(called.why)  # (etcd silent while it stood by: it comes back once it answers)
            if this.stopped:
                return LaunchOutcome(code=exits.from_signal(this.stopped[0]), signalled=this.stopped[0])
            return LaunchOutcome(code=exits.OK if called.job_done else exits.FAILED,
                                 cause=None if called.job_done else called.why)
        first = Membership.of(spec)
        listed = {**arrivals_of(this.decider), **{host_key(h): h for h in (*first.hosts, *first.spares)}}
        membership = Membership(tuple(listed[label] for label in called.hosts),
                                tuple(listed[label] for label in called.spares), first.min_nodes, first.max_nodes,
                                absent=tuple(h for h in first.hosts if host_key(h) not in called.hosts))
        print(f"manual: {said} {this.decider.label} taken in: attempt {called.attempt + 1} on {len(called.hosts)} "
              f"host(s) ({', '.join(called.hosts)})", file=sys.stderr, flush=True)
        try:
            this.decider.become("host")
        except EtcdError:
            pass  # (its key says what it was; a keepalive keeps it, and the decisions name it a host)
        following = self.on(membership.spec(spec, called.attempt), called.attempt)
        return AttemptsOnHosts(following, membership=membership).run()

    def returns(self, candidates: Sequence[Candidate]) -> EtcdReturns | None:
        """The lost hosts whose `run` is started again, and the spares standing by, taken in at a checkpoint while
        there is room (runner.launchers.manual.joins); host 0 of the round asks for them. None: none to wait for."""
        assert self._round is not None
        room = self._round.max_nodes - len(self.plan.job.hosts)
        if room < 1 or self._round.node != 0:  # (none listed may come: a host the spec does not list may arrive)
            return None
        return EtcdReturns(self._round.decider, candidates, room)

    def sessions(self, on_report: Callable[[int, AgentReport], None] | None = None,
                 replacing: Sequence[str] = (), returns: Returns | None = None) -> tuple[Ended, list[str]]:
        """This host's round (runner.launchers.manual.rounds); no records to take back (each host keeps its own)."""
        assert self._round is not None
        return run_round(self._round, on_report, returns if isinstance(returns, EtcdReturns) else None), []

    def on(self, spec: JobConfig, attempt: int) -> ManualLauncher:
        """This host's next round: on ``spec``'s hosts (those that went on after a loss), from ``attempt``."""
        assert self._round is not None
        job = job_on(self.plan.job, spec)
        job = dataclasses.replace(job, master_addr=self.default_master(spec, job.hosts) if len(job.hosts) > 1
                                  else "127.0.0.1")
        paths = dataclasses.replace(self.paths, attempt=attempt)
        following = ManualLauncher(plan=self.plan_for(job, paths), paths=paths, invocation=self.invocation,
                                   environment=self.environment)
        label = self._round.decider.label
        node = next(h.index for h in job.hosts if h.label == label)
        following._round = dataclasses.replace(self._round, plan=following.plan, paths=paths, node=node)
        return following

    def left_out(self) -> dict[int, str] | LaunchOutcome:
        """Nothing to check before a round: the hosts that go on ended the last one alive."""
        return {}


def _arrival_problems(job: Job, chosen: str) -> Iterator[Problem]:
    """launcher.manual.host names a machine the spec does not list: a host that arrives, where the job outlives its
    hosts and topology.max_nodes leaves room above them; its name (and launcher.manual.addr) a host's."""
    names = [h.reach or h.label for h in (*job.hosts, *job.spares)]
    room = (job.spec.topology.max_nodes or len(job.hosts)) - len(job.hosts)
    if not elasticity(job).enabled or room < 1:
        yield Problem("launcher.manual.host", f"{job.spec.launcher.manual.host!r} is none of the hosts {names}",
                      "an index from 0, or one of the names/addresses above; a host the spec does not list may "
                      "arrive only in a job that outlives its hosts, with room above them (topology.min_nodes and "
                      f"topology.max_nodes={len(job.hosts) + 1}, say)")
        return
    for key, value in (("launcher.manual.host", chosen), ("launcher.manual.addr", job.spec.launcher.manual.addr)):
        if value is not None and not is_valid_host(value):
            yield Problem(key, f"{value!r} is not a host name or IP address (this host arrives: the spec does not "
                               f"list it)", "letters, digits, '-', '_' and '.', or an IPv4/IPv6 literal")


def _linger(decider: Decider, most_s: float) -> None:
    """This host's member of the job's own etcd stays up until the other hosts have left it too (their member keys
    gone), at most ``most_s``: a host still ending its share needs the majority of members that decides."""
    deadline = time.monotonic() + most_s
    while time.monotonic() < deadline:
        try:
            if not decider.members.alive():
                return
        except EtcdError:
            return
        time.sleep(1.0)


def _etcd_problems(job: Job, probe: MachineProbe) -> Iterator[Problem]:
    """A job that outlives its hosts decides in etcd: the user's, or the job's own, which needs the etcd program and
    a majority of its members up, so the job cannot go on below that (a partition's smaller side never decides)."""
    elastic = elasticity(job)
    if not elastic.enabled or job.spec.launcher.manual.etcd:
        return
    if not probe.program_found(ETCD):
        yield Problem("launcher.manual.etcd", f"the job's own etcd needs the `{ETCD}` program on every host and spare "
                                              "(a member each), and it is not found here",
                      f"install it (Debian: apt-get install etcd-server), or name an etcd of yours: "
                      "launcher.manual.etcd=[host:port]")
    own = OwnCluster.of(job)
    if elastic.min_nodes < own.floor:
        yield Problem("topology.min_nodes", f"{elastic.min_nodes} with the job's own etcd: it has a member on each of "
                                            f"the {own.size} host(s) and spare(s) and decides while {own.floor} of "
                                            f"{own.size} are up ({own.size} // 2 + 1), so the job cannot go on with "
                                            f"fewer than {own.floor} host(s)",
                      f"topology.min_nodes={own.floor}, or name an etcd of yours that outlives the hosts "
                      f"(launcher.manual.etcd=[host:port]), which lets the job go on down to any number")
