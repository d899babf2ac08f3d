"""launcher=ssh: `run` logs in to every host with the system ssh client and starts each host's share there, as
launcher=manual's commands would, and is the job's one terminal.

For each host it runs, over ``ssh [launcher.ssh options] -- HOST 'COMMAND'`` (your ~/.ssh/config, agent and
ProxyJump apply; BatchMode: never a prompt):

1. **a check**, on every host at once, before anything starts: ``cd <workdir> && exec <run> --version`` — the host
   answers within ``launcher.ssh.connect_timeout_s``, has `run` with this machine's runner and torch versions, and
   the job's folder. Each failure names the host, why, and the command to try by hand; then nothing starts
   (runner.launchers.ssh.check);
2. **its share**: ``cd <workdir> && exec [env NAME=value ...] <run> --ssh-host <i> <run folder>``, with the run's
   spec.yaml (as pinned here) on its stdin: that `run` is the host's agent (runner.app.ssh_host), as a manual host's
   `run` is; the hosts find each other through host 0's store as ever (runner.worker.channel). This `run` relays
   every host's output, passes Ctrl-C, SIGTERM and the stop signal on over stdin, ends the job everywhere when a
   host is lost, and prints the one summary (runner.launchers.ssh.session);
3. **its records**, after the run, from a host whose run folder is not this one (another machine):
   ``cd <run folder> && exec tar -cf - --ignore-failed-read logs metrics.jsonl``: its ranks' logs, and from host 0
   how every rank ended and the metrics, so that this run folder and its summary cover every rank
   (runner.launchers.ssh.collect).

Every value that reaches the remote shell (paths, the `run` command, exported values) is quoted with shlex; host
names and options are checked before (runner.spec.validation, :meth:`SshLauncher.spec_problems`).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from runner.common import exits
from runner.environments.versions import installed
from runner.launchers.base import HostCommand, Launcher, LaunchOutcome, LaunchRequest
from runner.launchers.capabilities import Capabilities
from runner.launchers.manual import agreed_port, hosts_apart_problems
from runner.launchers.ssh.address import HostAddress, explained, host_addresses
from runner.launchers.ssh.check import REACH_FAILED, failures, paragraph
from runner.launchers.ssh.collect import collect
from runner.launchers.ssh.host import SshHost, collected, ssh_base
from runner.launchers.elastic.membership import Candidate, host_key, job_on
from runner.launchers.elastic.rounds import AttemptsOnHosts, Returns
from runner.launchers.ssh.rejoin import Returning, ReturnWatch
from runner.launchers.ssh.session import Ended, run_sessions
from runner.records.paths import RunPaths
from runner.spec.document import spec_yaml
from runner.spec.job import Job
from runner.spec.pins import Pins
from runner.spec.probe import MachineProbe
from runner.spec.problems import Problem
from runner.spec.elastic import elasticity
from runner.spec.schema import InitMethod, JobConfig, is_script
from runner.spec.topology import Host
from runner.spec.validation import ENV_NAME
from runner.worker.agent_reports import AgentReport

_OPTION = re.compile(r"^[A-Za-z][A-Za-z0-9]*=\S.*$")
_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


class SshLauncher(Launcher):
    name = "ssh"
    capabilities = Capabilities(
        supports_restarts=True,  # every host's agent restarts together, through host 0's store (runner.worker.channel)
        shares_run_folder=False,  # each host's run folder is its own, unless the hosts share a file system
        survives_lost_hosts=True,  # `run` starts the job again on the hosts that remain (runner.launchers.elastic.membership)
        takes_hosts_back=True,  # `run` tries the lost hosts again; one that answers joins (runner.launchers.ssh.rejoin)
        pins_master_port=True)  # the hosts' agents cannot learn a port chosen on one of them at launch

    @classmethod
    def spec_problems(cls, spec: JobConfig) -> Iterator[Problem]:
        opts = spec.launcher.ssh
        for i, name in enumerate(opts.export):
            if not ENV_NAME.match(name):
                yield Problem(f"launcher.ssh.export[{i}]", f"{name!r} is not a variable name",
                              "names only, e.g. launcher.ssh.export=[HF_HOME,WANDB_API_KEY]; the values are read here")
        for i, option in enumerate(opts.options):
            if not _OPTION.match(option):
                yield Problem(f"launcher.ssh.options[{i}]", f"{option!r} is not an ssh option as KEY=VALUE",
                              "e.g. 'launcher.ssh.options=[\"ProxyJump=bastion\",\"StrictHostKeyChecking=accept-new\"]' "
                              "(each becomes -o KEY=VALUE)")
        if opts.user is not None and not _USER.match(opts.user):
            yield Problem("launcher.ssh.user", f"{opts.user!r} is not a user name", "letters, digits, _ . - only")
        if opts.port is not None and not 1 <= opts.port <= 65535:
            yield Problem("launcher.ssh.port", f"must be 1-65535, got {opts.port}", "22, or leave it to ~/.ssh/config")
        if opts.connect_timeout_s <= 0:
            yield Problem("launcher.ssh.connect_timeout_s", f"must be positive, got {opts.connect_timeout_s}",
                          "e.g. 10 (seconds)")
        if opts.keepalive_s < 0:
            yield Problem("launcher.ssh.keepalive_s", f"must be 0 or more, got {opts.keepalive_s}",
                          "e.g. 5: a host that stops answering is lost after 3 x 5 s; 0: only a closed connection")
        for key, value in (("command", opts.command), ("run", opts.run)):
            if value is not None and (not value.strip() or value.startswith("-")):
                yield Problem(f"launcher.ssh.{key}", f"{value!r} is not a command",
                              "a program name or path, e.g. ssh, or /opt/venv/bin/run")
        if spec.launcher.snapshot_code:
            yield Problem("launcher.snapshot_code", "launcher=ssh: the copy would be made in this machine's run "
                                                    "folder, which the other hosts do not see",
                          "leave it off and check out the same code on every host (the check compares the runner "
                          "and torch there)")

    @classmethod
    def exported_names(cls, spec: JobConfig) -> tuple[str, ...]:
        return tuple(spec.launcher.ssh.export)

    @classmethod
    def job_problems(cls, job: Job, probe: MachineProbe) -> Iterator[Problem]:
        yield from hosts_apart_problems(job, cls.name)
        if len(job.hosts) == 1 and job.hosts[0].reach is None:  # (several: hosts_apart_problems says it)
            yield Problem("topology.hosts", "launcher=ssh logs in to every host by its name, but the one host has none",
                          "name it: 'topology.hosts=[{name: gpu-a, devices: 2}]', or launcher=local for this machine")

    @classmethod
    def pins(cls, job: Job, paths: RunPaths) -> Pins:
        """The base pins, and the address of each host named as ssh knows it (runner.launchers.ssh.address): what
        ``ssh -G NAME`` gives as its HostName, which every host dials instead of an alias it cannot resolve."""
        pins = super().pins(job, paths)
        found = host_addresses(job.hosts, ssh_base(job.spec.launcher.ssh))
        if not any(a.found for a in found):
            return pins
        return dataclasses.replace(pins, host_addrs=tuple(a.addr if a.found else None for a in found))

    def addresses(self) -> tuple[HostAddress, ...]:
        """Where the hosts are dialled, and why (the dry run and launch.txt say it)."""
        base = ssh_base(self.plan.job.spec.launcher.ssh)
        return tuple(explained(h, base) for h in self.plan.job.hosts)

    @classmethod
    def master_port(cls, job: Job, paths: RunPaths | None) -> str:
        return agreed_port(job, paths) if len(job.hosts) > 1 else super().master_port(job, paths)

    # -- the commands ---------------------------------------------------------------------------------------------
    def workdir(self) -> str:
        """The job's folder, where every host's commands start (the launch pins it: the folder `run` starts in, or
        workdir=...)."""
        return self.plan.job.spec.workdir or self.invocation.cwd

    def remote_folder(self) -> str:
        """Where each host's `run` keeps the run: this run folder, at its path under the job's folder (workdir) where
        it is under the folder `run` started in, else at the same path."""
        root, cwd, workdir = self.paths.root.absolute(), Path(self.invocation.cwd), Path(self.workdir())
        return str(workdir / root.relative_to(cwd)) if root.is_relative_to(cwd) else str(root)

    def hosts(self) -> tuple[SshHost, ...]:
        return tuple(self._ssh_host(host, f"host {host.index}") for host in self.plan.job.hosts)

    def spare_hosts(self) -> tuple[SshHost, ...]:
        """topology.spares, as hosts to check with the others (each dials host 0's rendezvous as a host other than
        host 0 would) and to start in a lost host's place (runner.launchers.elastic.rounds)."""
        return tuple(self._ssh_host(host, f"spare {i}") for i, host in enumerate(self.plan.job.spares))

    def _ssh_host(self, host: Host, label: str) -> SshHost:
        """Host ``host``'s commands: its check, its share (from this launch's attempt on) and its records."""
        opts = self.plan.job.spec.launcher.ssh
        base = ssh_base(opts)
        run_command = opts.run or self.invocation.run_command
        run = shlex.quote(run_command)
        cd = f"cd {shlex.quote(self.workdir())} && exec"
        env = "".join(f"{shlex.quote(f'{k}={v}')} " for k, v in self.environment.exported.items())
        folder = shlex.quote(self.remote_folder())
        rendezvous = self.rendezvous()
        destination = host.name or host.addr or host.label
        attempt = f" --attempt {self.paths.attempt}" if self.paths.attempt else ""
        start = f"{cd} {'env ' + env if env else ''}{run} --ssh-host {host.index} {folder}{attempt}"
        check = f"{cd} {run} --version"
        if rendezvous is not None:  # `run --reach` says its versions too: one interpreter a check
            check = f"{cd} {run} --reach {shlex.quote(rendezvous[0])} {rendezvous[1]} {host.index}"
        collect = f"cd {folder} && exec tar -cf - --ignore-failed-read {shlex.join(collected(self.paths))}"
        ranks = tuple(r.global_rank for r in self.plan.host_records(host.index)) if host in self.plan.job.hosts else ()
        return SshHost(index=host.index, name=host.label, label=f"{label} ({destination})", destination=destination,
                       ranks=ranks, run=run_command, check=(*base, "--", destination, check),
                       dials=rendezvous is not None, start=(*base, "--", destination, start),
                       collect=(*base, "--", destination, collect))

    def rendezvous(self) -> tuple[str, int] | None:
        """Host 0's rendezvous address and port, which every host's check dials (runner.worker.reach); None where
        the ranks dial none (one host, or init=file)."""
        plan = self.plan
        if len(plan.job.hosts) < 2 or plan.job.spec.init.method is InitMethod.file:
            return None
        if not plan.master_known or not plan.master_addr:
            return None
        return plan.master_addr, int(plan.master_port)

    def request(self) -> LaunchRequest:
        commands = [HostCommand(host=a.line(), argv=None) for a in self.addresses()]
        hosts = self.hosts()
        rendezvous = self.rendezvous()
        dials = f", and that it resolves {rendezvous[0]} and reaches its port {rendezvous[1]} (host 0's, the ranks' " \
                f"rendezvous)" if rendezvous else ""
        for h in hosts:
            commands.append(HostCommand(host=h.label, argv=h.check,
                                        note=f"the check, on every host at once before anything starts: reachable, "
                                             f"`run` there, its runner and torch, the job's folder{dials}"))
        for h in self.spare_hosts():
            commands.append(HostCommand(host=h.label, argv=h.check,
                                        note="a spare, checked with the hosts; started in a lost host's place"))
        elastic = elasticity(self.plan.job)
        if elastic.enabled:
            commands.append(HostCommand(host=elastic.line(), argv=None))
            commands.append(HostCommand(host=self.rejoin_line(), argv=None))
        for h in hosts:
            ranks = f"rank {h.ranks[0]}" if len(h.ranks) == 1 else f"ranks {h.ranks[0]}..{h.ranks[-1]}"
            commands.append(HostCommand(host=h.label, argv=h.start,
                                        note=f"starts {len(h.ranks)} process(es) ({ranks}); the run's "
                                             f"{self.paths.spec.name} on its stdin"))
        for h in hosts:
            commands.append(HostCommand(host=h.label, argv=h.collect,
                                        note="after the run, if its run folder is not this one: its records"))
        return LaunchRequest(launcher=self.name, commands=tuple(commands))

    def rejoin_line(self) -> str:
        """The dry run's words on a lost host that answers again (runner.launchers.ssh.rejoin)."""
        spec = self.plan.job.spec
        if spec.launcher.ssh.rejoin_s <= 0:
            return "a lost host is not taken back (launcher.ssh.rejoin_s=0)"
        most = spec.topology.max_nodes or len(self.plan.job.hosts)
        return (f"a lost host is tried again every {spec.launcher.ssh.rejoin_s} s (launcher.ssh.rejoin_s) and joins at "
                f"the next checkpoint, up to {most} host(s) (topology.max_nodes), each at most once per "
                f"{spec.launcher.rejoin_after_s:g} s (launcher.rejoin_after_s)")

    # -- the launch -------------------------------------------------------------------------------------------------
    def launch(self, request: LaunchRequest) -> LaunchOutcome:
        unready: list[str] = []
        refused = self.check(with_spares=True, unready=unready)
        if refused is not None:
            return refused
        if elasticity(self.plan.job).enabled:  # a lost host: the job starts again on those that remain
            return AttemptsOnHosts(self, unready).run()
        ended, _ = self.sessions()
        return LaunchOutcome(code=ended.code, signalled=ended.signalled, cause=ended.cause)

    def check(self, with_spares: bool = False, unready: list[str] | None = None) -> LaunchOutcome | None:
        """Every host checked at once (and the spares, ``with_spares``), its line said: None when all are ready, else
        how the launch ended (nothing was started). ``unready``: given a list, a spare that fails is not a refusal
        where lost hosts are tried again (launcher.ssh.rejoin_s): it is said, appended, and tried while the job runs."""
        spec = self.plan.job.spec
        hosts, spares = self.hosts(), self.spare_hosts() if with_spares else ()
        started = time.perf_counter()
        try:
            failed = failures((*hosts, *spares), installed(), spec.launcher.ssh.connect_timeout_s)
        except KeyboardInterrupt:  # Ctrl-C before anything started (the checks' ssh got it too)
            print("\nSIGINT during the check: nothing was started.", file=sys.stderr, flush=True)
            return LaunchOutcome(code=exits.from_signal(signal.SIGINT), signalled=signal.SIGINT)
        later = [h for h in spares if h in failed] if unready is not None and spec.launcher.ssh.rejoin_s > 0 else []
        refused = [paragraph(h, why, hint) for h, (why, hint) in failed.items() if h not in later]
        if refused:
            print("\n".join(refused) + "\n\nnothing was started.", file=sys.stderr, flush=True)
            return LaunchOutcome(code=exits.INVALID)
        for h in later:
            print(f"ssh: {h.label} not ready: {failed[h][0]}; tried again every {spec.launcher.ssh.rejoin_s} s "
                  f"(launcher.ssh.rejoin_s) while the job runs", file=sys.stderr, flush=True)
            assert unready is not None
            unready.append(h.name)
        self._say_ready(hosts, time.perf_counter() - started, [h for h in spares if h not in later])
        return None

    def _say_ready(self, hosts: tuple[SshHost, ...], took_s: float, spares: Sequence[SshHost] = ()) -> None:
        rendezvous = self.rendezvous()
        dialled = f"; each reaches host 0's rendezvous at {rendezvous[0]} port {rendezvous[1]}" if rendezvous else ""
        ready = f" (spare(s) ready: {', '.join(h.destination for h in spares)})" if spares else ""
        print(f"ssh: {len(hosts)} host(s) ready ({installed().short()}) in {took_s:.1f} s: "
              f"{', '.join(h.destination for h in hosts)}{dialled}{ready}", file=sys.stderr, flush=True)

    def left_out(self) -> dict[int, str] | LaunchOutcome:
        """The check before a round (after a loss or a join): the hosts that fail it, each with why (empty: every
        host ready, as :meth:`check` says it). Where every host but host 0 fails to reach host 0's rendezvous, host 0
        is the one left out (its network, not theirs)."""
        hosts = self.hosts()
        started = time.perf_counter()
        try:
            failed = failures(hosts, installed(), self.plan.job.spec.launcher.ssh.connect_timeout_s)
        except KeyboardInterrupt:  # Ctrl-C between two rounds (the checks' ssh got it too)
            print("\nSIGINT during the check: the next attempt was not started.", file=sys.stderr, flush=True)
            return LaunchOutcome(code=exits.from_signal(signal.SIGINT), signalled=signal.SIGINT)
        if not failed:
            self._say_ready(hosts, time.perf_counter() - started)
            return {}
        others = [h for h in hosts if h.index != 0]
        if len(others) > 1 and all(h in failed and failed[h][0].startswith(REACH_FAILED) for h in others):
            why = f"none of the {len(others)} other hosts reaches its rendezvous ({failed[others[0]][0]})"
            print(f"ssh: host 0 ({hosts[0].destination}) left out: {why}", file=sys.stderr, flush=True)
            return {0: why}
        for host, (why, hint) in failed.items():
            print(paragraph(host, why, hint, said="left out"), file=sys.stderr, flush=True)
        return {host.index: f"it failed the check: {why}" for host, (why, _) in failed.items()}

    def sessions(self, on_report: Callable[[int, AgentReport], None] | None = None,
                 replacing: Sequence[str] = (), returns: Returns | None = None) -> tuple[Ended, list[str]]:
        """Every host's share, relayed to its end (runner.launchers.ssh.session), then their records taken back
        (replacing those an earlier round took: ``replacing``); how the sessions ended, and the records taken.
        ``returns``: lost hosts tried again meanwhile (:meth:`returns`), which join at the next checkpoint."""
        spec = self.plan.job.spec
        hosts = self.hosts()
        ended = run_sessions(hosts, spec_yaml(spec), self.plan.rules.stop_signal, spec.launcher.grace_s,
                             spec.launcher.ssh.keepalive_s, on_report, returns, is_script(spec.recipe))
        try:
            return ended, collect(hosts, self.paths, ended.lost, replacing)
        except KeyboardInterrupt:  # the job is over: only its records were being taken back
            print("\nSIGINT: the hosts' records stay in their run folders", file=sys.stderr, flush=True)
        return ended, []

    def returns(self, candidates: Sequence[Candidate]) -> ReturnWatch | None:
        """The hosts ``candidates`` (lost ones, spares not ready at the start) tried every launcher.ssh.rejoin_s from
        when each may be (runner.launchers.ssh.rejoin), each with the check of the start: it dials this round's
        rendezvous as a host other than host 0 does; None where there is none to try or launcher.ssh.rejoin_s=0."""
        opts = self.plan.job.spec.launcher.ssh
        if not candidates or opts.rejoin_s <= 0:
            return None
        first = len(self.plan.job.hosts) + len(self.plan.job.spares)
        tried = [Returning(key=host_key(c.host), due=c.due, joins=c.joins, host=self._ssh_host(
            Host(index=first + i, name=c.host.name, addr=c.host.addr, devices=c.host.devices or 1,
                 gpus=tuple(c.host.gpus or ())), f"{'lost host' if c.joins else 'spare'} {c.host.name or c.host.addr}"))
                 for i, c in enumerate(candidates)]
        return ReturnWatch(tried, opts.rejoin_s, opts.connect_timeout_s, installed())

    def on(self, spec: JobConfig, attempt: int) -> SshLauncher:
        """This launch on another spec's hosts (the hosts that remain after a loss), from ``attempt`` on."""
        job = job_on(self.plan.job, spec)
        job = dataclasses.replace(job, master_addr=self.default_master(spec, job.hosts) if len(job.hosts) > 1
                                  else "127.0.0.1")
        paths = dataclasses.replace(self.paths, attempt=attempt)
        return SshLauncher(plan=self.plan_for(job, paths), paths=paths, invocation=self.invocation,
                           environment=self.environment)
