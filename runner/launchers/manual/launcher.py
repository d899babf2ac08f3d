"""launcher=manual: one `run` command per host, typed by hand on each host.

Each command repeats the user's overrides and pins what the hosts must agree on (run id, master
port: the launch's pins, from the pinned spec), plus the host it is for; run on that host, it starts that
host's share like launcher=local. With topology.min_nodes, each host's `run` runs its rounds: the job goes on without
a lost host (runner.launchers.manual.rounds).
"""

from __future__ import annotations

import dataclasses
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from runner.common import exits
from runner.common.signals import handling
from runner.launchers.base import HostCommand, Launcher, LaunchOutcome, LaunchRequest, named_hosts_problems
from runner.launchers.elastic.membership import Membership, job_on
from runner.launchers.elastic.rounds import AttemptsOnHosts, Ended
from runner.launchers.manual.meeting import MeetingPoint, meeting_port
from runner.launchers.manual.rounds import NotCalled, Round, run_round, stand_by
from runner.launchers.manual.watch import BEATS_MISSED
from runner.plan.processes import Deferred, port_for
from runner.records.paths import RunPaths
from runner.spec.job import Job
from runner.spec.elastic import elasticity
from runner.spec.probe import LocalProbe, MachineProbe
from runner.spec.problems import Problem
from runner.spec.schema import InitMethod, JobConfig
from runner.spec.topology import is_loopback
from runner.worker.agent_reports import AgentReport
from runner.worker.zygote import Zygote

_PINNED = ("launcher.manual.host=", "run_id=", "init.master_port=", "dry_run=")


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


class ManualLauncher(Launcher):
    name = "manual"
    supports_restarts = True  # the hosts restart together, agreeing through host 0's store (runner.worker.channel)
    shares_run_folder = False  # each host's `run` makes its own run folder
    survives_lost_hosts = True  # each host's `run` meets the others after a loss (runner.launchers.manual.rounds)
    forks_here = True
    hosts_start_apart = True
    pins_master_port = True  # the hosts cannot learn a port chosen on one of them at launch

    def __init__(self, **launch: Any) -> None:
        super().__init__(**launch)
        self._round: Round | None = None  # this host's round, once it runs rounds (a job that outlives its hosts)

    @classmethod
    def job_problems(cls, job: Job, probe: MachineProbe) -> Iterator[Problem]:
        yield from hosts_apart_problems(job, cls.name)
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
            names = [h.reach or h.label for h in every]
            yield Problem("launcher.manual.host", f"{chosen!r} is none of the hosts {names}",
                          "an index from 0, or one of the names/addresses above")

    @classmethod
    def spec_problems(cls, spec: JobConfig) -> Iterator[Problem]:
        yield from super().spec_problems(spec)
        if spec.launcher.manual.keepalive_s < 1:
            yield Problem("launcher.manual.keepalive_s", f"must be 1 or more (seconds between a host's questions to "
                                                         f"its peers), got {spec.launcher.manual.keepalive_s}",
                          "launcher.manual.keepalive_s=2 (the default): a host silent for 8 s is lost")

    @classmethod
    def hands_share_to_agent(cls, job: Job) -> bool:
        """A job that outlives its hosts runs its rounds in `run` itself (each a HostAgent of its own)."""
        return not elasticity(job).enabled

    @classmethod
    def master_port(cls, job: Job, paths: RunPaths | None) -> str:
        return agreed_port(job, paths) if len(job.hosts) > 1 else super().master_port(job, paths)

    def request(self) -> LaunchRequest:
        inv, spec = self.invocation, self.plan.job.spec
        base = [inv.run_command]
        if inv.config_dir:
            base += ["--config-dir", inv.config_dir]
        if inv.config_name:
            base += ["--config-name", inv.config_name]
        base += [o for o in inv.overrides if not o.startswith(_PINNED)]
        base.append(f"run_id={spec.run_id}")
        if spec.init.master_port:
            base.append(f"init.master_port={spec.init.master_port}")
        commands = []
        for host in self.plan.job.hosts:
            n = self.plan.processes_per_host[host.index]
            argv = (*base, f"launcher.manual.host={host.index}")
            where = host.reach or host.label
            commands.append(HostCommand(host=f"host {host.index} ({where})", argv=argv, note=f"starts {n} process(es)",
                                        cwd=inv.cwd))
        for spare in self.plan.job.spares:
            commands.append(HostCommand(host=f"spare {spare.label}",
                                        argv=(*base, f"launcher.manual.host={spare.label}"),
                                        note="waits, ready to take a lost host's place", cwd=inv.cwd))
        return LaunchRequest(launcher=self.name, commands=(*commands, *self._rounds_said()))

    def _rounds_said(self) -> tuple[HostCommand, ...]:
        """What the dry run says of a job that outlives its hosts: how it goes on, and how a lost host is found."""
        job = self.plan.job
        if not elasticity(job).enabled:
            return ()
        every = job.spec.launcher.manual.keepalive_s
        return (HostCommand(host=elasticity(job).line(), argv=None),
                HostCommand(host=f"each host's `run` serves a meeting point on port {meeting_port(self.paths.run_id)} "
                                 f"(derived from the run id) and asks its peers' every {every} s "
                                 f"(launcher.manual.keepalive_s): a peer silent for {BEATS_MISSED * every} s, or whose "
                                 f"point refuses, is lost; after an attempt ends the hosts meet at the first that "
                                 f"answers, and more than half of them go on", argv=None))

    def this_host(self, names: frozenset[str]) -> int | str:
        """This machine's node rank (a spare's index follows the hosts'): launcher.manual.host, else the one host
        whose name/address is ours."""
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
        return (f"{found} this machine ({', '.join(sorted(n for n in names if not is_loopback(n))[:6])}); "
                f"hint: add launcher.manual.host=<index> (the dry run prints each host's command)")

    def launch(self, request: LaunchRequest) -> LaunchOutcome:
        node = self.this_host(LocalProbe().host_names())
        if isinstance(node, str):
            print(f"error: launcher.manual.host: {node}", file=sys.stderr)
            return LaunchOutcome(code=exits.INVALID)
        if elasticity(self.plan.job).enabled:
            return self._rounds(node)
        return LaunchOutcome(code=self.run_host(node))

    # -- a job that outlives its hosts: this host's rounds (runner.launchers.elastic.rounds) ----------------------
    def _rounds(self, node: int) -> LaunchOutcome:
        port = meeting_port(self.paths.run_id)
        try:
            point = MeetingPoint(self.paths.run_id, (*self.plan.job.hosts, *self.plan.job.spares)[node].label, "",
                                 port).start()
        except OSError as e:
            print(f"error: launcher=manual: this host's meeting point (port {port}, derived from the run id) could "
                  f"not open: {e}; hint: another `run` of this run id on this machine?", file=sys.stderr)
            return LaunchOutcome(code=exits.INVALID)
        zygote = Zygote.start()
        self._round = this = Round(plan=self.plan, paths=self.paths, environment=self.environment, point=point,
                                   zygote=zygote, node=node, first=True)
        try:
            with handling((signal.SIGINT, signal.SIGTERM), lambda signum, _frame: this.stopped.append(signum)):
                return self._stand_by() if node >= len(self.plan.job.hosts) else AttemptsOnHosts(self).run()
        finally:
            zygote.close()
            point.close()

    def _stand_by(self) -> LaunchOutcome:
        """A spare's `run`: ready until called in (then its rounds, from the attempt it was called to), or until the
        job ends without it."""
        assert self._round is not None
        this, spec = self._round, self.plan.job.spec
        windows = this.windows()
        called = stand_by(this.point, [*this.peers, *this.spares], spec.launcher.manual.keepalive_s,
                          windows.come_s + windows.silent_s, spec.init.timeout_s, this.stopped)
        if isinstance(called, NotCalled):
            print(f"manual: spare {this.point.label}: {called.why}", file=sys.stderr, flush=True)
            if this.stopped:
                return LaunchOutcome(code=exits.from_signal(this.stopped[0]), signalled=this.stopped[0])
            return LaunchOutcome(code=exits.OK if called.job_done else exits.FAILED,
                                 cause=None if called.job_done else called.why)
        listed = {h.name or h.addr: h for h in (*(spec.topology.hosts or ()), *(spec.topology.spares or ()))}
        membership = Membership(tuple(listed[label] for label in called.hosts),
                                tuple(listed[label] for label in called.spares), Membership.of(spec).min_nodes)
        print(f"manual: spare {this.point.label} called in: attempt {called.attempt + 1} on {len(called.hosts)} "
              f"host(s) ({', '.join(called.hosts)})", file=sys.stderr, flush=True)
        return AttemptsOnHosts(self.on(membership.spec(spec, called.attempt), called.attempt)).run()

    def sessions(self, on_report: Callable[[int, AgentReport], None] | None = None,
                 replacing: Sequence[str] = ()) -> tuple[Ended, list[str]]:
        """This host's round (runner.launchers.manual.rounds); no records to take back (each host keeps its own)."""
        assert self._round is not None
        return run_round(self._round, on_report), []

    def on(self, spec: JobConfig, attempt: int) -> ManualLauncher:
        """This host's next round: on ``spec``'s hosts (those that went on after a loss), from ``attempt``."""
        assert self._round is not None
        job = job_on(self.plan.job, spec)
        job = dataclasses.replace(job, master_addr=self.default_master(spec, job.hosts) if len(job.hosts) > 1
                                  else "127.0.0.1")
        paths = dataclasses.replace(self.paths, attempt=attempt)
        following = ManualLauncher(plan=self.plan_for(job, paths), paths=paths, invocation=self.invocation,
                                   environment=self.environment)
        label = self._round.point.label
        node = next(h.index for h in job.hosts if h.label == label)
        following._round = dataclasses.replace(self._round, plan=following.plan, paths=paths, node=node, first=False)
        return following

    def check(self, with_spares: bool = False) -> LaunchOutcome | None:
        """Nothing to check before a round: the hosts that go on came to the meeting."""
        return None
