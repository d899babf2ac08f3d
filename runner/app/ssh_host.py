"""One host's share of a launcher=ssh job: ``run --ssh-host <node rank> <run folder>``, started over ssh by the
launching `run` (runner.launchers.ssh.launcher) in the job's folder, with the run's pinned spec on its stdin.

It is that host's agent, as a manual host's `run` is, through the one host-side entry (runner.app.host_entry), which
:class:`SshHost` adapts: the spec comes on stdin, the node rank and folder on the command line; the run is kept in
``<run folder>`` (spec.yaml written there if the folder is its own), and the host's share restarts in place. It
prints no summary: the launching `run` prints the one summary of the job, and hears this host's reports on its
stderr. While it runs, a thread reads its stdin (runner.launchers.ssh.protocol): a signal the launching `run` got is
sent to this process, as if its own; an end of the job goes to the agent; and the end of stdin — the launching `run`
or the connection is gone — or no beat for a while means the holder is gone (runner.app.host_entry.HolderGone: a
SIGTERM, then the end of this process and its ranks after the share's hard stop). So nothing outlives its ssh session.
"""

from __future__ import annotations

import io
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, ClassVar, Protocol, TextIO

from runner.app.host_entry import HolderGone, Placed, Refused, enter, say
from runner.common import exits
from runner.common.files import write_atomically
from runner.common.signals import StopRequest
from runner.environments.process import ProcessEnvironment
from runner.launchers import LAUNCHERS
from runner.launchers.ssh.protocol import BEATS_MISSED, EndJob, PassSignal, ProtocolError, parse, read_spec
from runner.records.paths import RunPaths
from runner.spec.document import load_spec_text, spec_yaml
from runner.spec.elastic import declares_elasticity
from runner.spec.job import Job
from runner.spec.schema import JobConfig
from runner.worker.agent_reports import Leaving, say_report
from runner.worker.channel_records import JobFailure
from runner.worker.host_agent import HostAgent
from runner.worker.share import HostShare

USAGE = ("usage: run --ssh-host <node rank> <run folder> [--attempt N]  (started by launcher=ssh, with the run's spec "
         "on stdin)")


class HostLabelled(io.TextIOBase):
    """This `run`'s own stderr, each line headed with its host (``[host b] ``): on the launching `run`'s terminal,
    which shows every host, the agent's words say whose they are. Its ranks' output is not touched: the agent relays
    it to descriptor 2 itself (``fileno``), and each rank makes its streams anew (runner.worker.stdio)."""

    def __init__(self, stream: TextIO, label: str) -> None:
        self._stream = stream
        self._label = label
        self._line_start = True

    def write(self, text: str) -> int:
        out = []
        for piece in text.splitlines(keepends=True):
            if self._line_start and piece.strip():
                out.append(self._label)
            out.append(piece)
            self._line_start = piece.endswith("\n")
        self._stream.write("".join(out))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def fileno(self) -> int:
        return self._stream.fileno()

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True


def _until_agent(signum: int, _frame: object) -> None:
    """SIGINT or SIGTERM before the agent runs: nothing has started yet, so this host's share ends here."""
    sys.stderr.flush()
    os._exit(exits.from_signal(signum))


class Agent(Protocol):
    """What a DriverWatch asks of the host's agent (runner.worker.host_agent.HostAgent)."""

    def end_job(self, failure: JobFailure) -> None: ...


class DriverWatch:
    """How an ssh host hears its holder, the launching `run`: what it says after the spec (the module docstring),
    read by a thread until stdin ends; and a second thread that takes it as gone when no beat came for a while
    (launcher.ssh.keepalive_s: a network that drops everything closes no connection). Either calls ``gone``."""

    def __init__(self, stream: IO[bytes], agent: Agent, gone: Callable[[str], None], beat_s: float) -> None:
        self.stream = stream
        self.agent = agent
        self.gone = gone
        self.beat_s = beat_s
        self.heard = time.monotonic()
        self.driver_signalled = False  # the signals that reach this process now come from the launching `run`

    def start(self) -> None:
        threading.Thread(target=self._read, name="runner-ssh-stdin", daemon=True).start()
        if self.beat_s:
            threading.Thread(target=self._watch, name="runner-ssh-beats", daemon=True).start()

    def _read(self) -> None:
        for line in iter(self.stream.readline, b""):
            self.heard = time.monotonic()
            message = parse(line)
            if isinstance(message, PassSignal):
                self.driver_signalled = True
                os.kill(os.getpid(), message.signum)
            elif isinstance(message, EndJob):
                self.agent.end_job(message.failure)
        self._driver_gone("")  # the launching `run`, or the connection to it, is gone

    def _watch(self) -> None:
        silent_s = BEATS_MISSED * self.beat_s
        while time.monotonic() - self.heard < silent_s:
            time.sleep(self.beat_s)
        self._driver_gone(f"no word from the launching `run` for {silent_s:g} s (launcher.ssh.keepalive_s="
                          f"{self.beat_s:g}): stopping this host's share")

    def _driver_gone(self, why: str) -> None:
        self.driver_signalled = True  # (the SIGTERM that follows is not this host's own: it does not leave)
        self.gone(why)


@dataclass(frozen=True)
class SshHost:
    """launcher=ssh's adapter to the host-side entry (runner.app.host_entry): host ``node``'s share, kept in
    ``folder``, from attempt ``attempt`` (a job started again on the hosts that remain after a loss), its spec and
    its holder's words on ``stream``."""

    node: int
    folder: Path
    stream: IO[bytes]
    attempt: int = 0
    restarts_itself: ClassVar[bool] = True

    @classmethod
    def of(cls, argv: list[str], stream: IO[bytes]) -> SshHost | None:
        """From ``<node rank> <run folder> [--attempt N]``; None: not that."""
        attempt = 0
        if len(argv) == 4 and argv[2] == "--attempt" and argv[3].isdigit():
            argv, attempt = argv[:2], int(argv[3])
        if len(argv) != 2 or not argv[0].isdigit():
            return None
        return cls(int(argv[0]), Path(argv[1]), stream, attempt)

    def spec(self) -> JobConfig:
        """The spec on stdin; from here on this process's stderr is headed with its host, its refusals too (the
        launching `run`'s terminal shows every host)."""
        try:
            spec = load_spec_text(read_spec(self.stream))
        except (ProtocolError, ValueError) as e:
            raise Refused(f"error: {e}") from None
        listed = spec.topology.hosts or []
        host = listed[self.node] if 0 <= self.node < len(listed) else None
        named = host.name if host is not None and host.name else f"node{self.node}"
        sys.stderr = HostLabelled(sys.stderr, f"[host {named}] ")
        return spec

    def place(self, job: Job, environment: ProcessEnvironment) -> Placed:
        if not 0 <= self.node < len(job.hosts):
            raise Refused(f"error: --ssh-host {self.node}: the spec has hosts 0..{len(job.hosts) - 1}")
        paths = RunPaths(self.folder, job.spec.run_id or self.folder.name, self.attempt)
        return Placed(LAUNCHERS["ssh"].host_plan(job, paths, environment), self.node, paths)

    def run(self, share: HostShare, only: int | None, early_stop: StopRequest | None, gone: HolderGone) -> int:
        spec, paths = share.plan.job.spec, share.paths
        if not paths.spec.exists():  # a run folder of this host's own: say what the run is, as the launching `run` did
            write_atomically(paths.spec, spec_yaml(spec))  # (hosts that share it without `run` may both write it)
        # its reports go to the launching `run`, which takes them out of what it shows
        watch: list[DriverWatch] = []
        agent = HostAgent(share, early_stop=early_stop, reporter=say_report,
                          on_signal=lambda signum: _leaving(signum, watch, declares_elasticity(spec)))
        watch.append(DriverWatch(self.stream, agent, gone, spec.launcher.ssh.keepalive_s))
        watch[0].start()
        # Ctrl-\ to the launching `run` comes to host 0's: its agent says where every rank of every host is
        signal.signal(signal.SIGQUIT, lambda _s, _f: agent.ask_where())
        return agent.run()


def _leaving(signum: int, watch: list[DriverWatch], elastic: bool) -> None:
    """SIGTERM of this host's own (a preempted machine: not one the launching `run` passed on, nor its going) in a job
    that outlives its hosts: this host leaves; the launching `run` hears it (a report) and goes on without it, from
    the checkpoint the stop makes every rank save."""
    if signum != signal.SIGTERM or not elastic or (watch and watch[0].driver_signalled):
        return
    say("SIGTERM to this host's `run`: it leaves the job (a preempted machine); the others go on without it")
    say_report(Leaving(at=time.time()))


def main(argv: list[str]) -> None:
    """``run --ssh-host <node rank> <run folder> [--attempt N]`` (runner.app.cli hands it these arguments)."""
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, _until_agent)
    enter(SshHost.of(argv, sys.stdin.buffer), USAGE)
