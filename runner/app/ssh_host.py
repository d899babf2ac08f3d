"""One host's share of a launcher=ssh job: ``run --ssh-host <node rank> <run folder>``, started over ssh by the
launching `run` (runner.launchers.ssh.launcher) in the job's folder, with the run's pinned spec on its stdin.

It is that host's agent, as a manual host's `run` is: it validates and plans the spec again here (the devices, the
network), keeps the run in ``<run folder>`` (writing spec.yaml there if the folder is its own), and runs the host's
share with a HostAgent, restarts included. It prints no summary: the launching `run` prints the one summary of the
job. While it runs, a thread reads its stdin (runner.launchers.ssh.protocol): a signal the launching `run` got is
sent to this process, as if its own; an end of the job goes to the agent; and the end of stdin — the launching
`run` or the connection is gone — or no beat for a while is a SIGTERM: the ranks stop (a recipe checkpoints), and
whatever still runs :data:`HARD_STOP_MARGIN_S` after ``launcher.grace_s`` ends with this process (its ranks die with
it). So nothing outlives its ssh session.
"""

from __future__ import annotations

import io
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import IO, TextIO

from runner.app.task import tried_by_run
from runner.common import exits
from runner.common.files import write_atomically
from runner.common.signals import StopRequest
from runner.environments.process import ProcessEnvironment
from runner.launchers import LAUNCHERS, validate
from runner.launchers.ssh.protocol import BEATS_MISSED, EndJob, PassSignal, ProtocolError, parse, read_spec
from runner.records.paths import RunPaths
from runner.spec.elastic import declares_elasticity
from runner.worker.agent_reports import Leaving, say_report
from runner.spec.document import load_spec_text, spec_yaml
from runner.spec.probe import LocalProbe
from runner.spec.problems import render_problems
from runner.worker.attempt_state import FAILURE_STOP_S, HARD_STOP_MARGIN_S
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


class DriverWatch:
    """What the launching `run` says after the spec (the module docstring), read by a thread until stdin ends; and a
    second thread that takes the launching `run` as gone when no beat came for a while (launcher.ssh.keepalive_s:
    a network that drops everything closes no connection)."""

    def __init__(self, stream: IO[bytes], agent: HostAgent, hard_stop_s: float, beat_s: float) -> None:
        self.stream = stream
        self.agent = agent
        self.hard_stop_s = hard_stop_s
        self.beat_s = beat_s
        self.heard = time.monotonic()
        self._gone = threading.Lock()
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
        self._driver_gone()  # the launching `run`, or the connection to it, is gone

    def _watch(self) -> None:
        silent_s = BEATS_MISSED * self.beat_s
        while time.monotonic() - self.heard < silent_s:
            time.sleep(self.beat_s)
        _say(f"no word from the launching `run` for {silent_s:g} s (launcher.ssh.keepalive_s={self.beat_s:g}): "
             f"stopping this host's share")
        self._driver_gone()

    def _driver_gone(self) -> None:
        """As SIGTERM; whatever still runs after the agent's time to stop its ranks ends with this process."""
        if not self._gone.acquire(blocking=False):
            return
        try:
            self.driver_signalled = True
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(self.hard_stop_s)
            _say("")  # (what the agent wrote, if its stream is still there)
        finally:  # whatever happens above (a stream whose reader is gone raises): nothing outlives its session
            os._exit(exits.from_signal(signal.SIGTERM))  # the ranks die with this process (PR_SET_PDEATHSIG)


def _say(text: str) -> None:
    """A line on stderr, if anybody can read it: once the launching `run` or the connection is gone, the stream's
    reader is gone too, and writing raises (BrokenPipeError) where it must not stop this host's share from ending."""
    try:
        if text:
            print(text, file=sys.stderr)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def run_share(node: int, folder: Path, stream: IO[bytes], environment: ProcessEnvironment,
              early_stop: StopRequest | None = None, attempt: int = 0) -> int:
    """Host ``node``'s share of the job whose spec comes on ``stream``, run in ``folder``; its exit status.
    ``early_stop``: the stop signal caught before the host agent handles it (passed on to the ranks once they run);
    ``attempt``: the first attempt to run (a job started again on the hosts that remain after a loss)."""
    try:
        spec = load_spec_text(read_spec(stream))
    except (ProtocolError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return exits.INVALID
    launcher = LAUNCHERS["ssh"]
    listed = spec.topology.hosts or []
    named = listed[node].name if 0 <= node < len(listed) and listed[node].name else f"node{node}"
    sys.stderr = HostLabelled(sys.stderr, f"[host {named}] ")  # its refusal too: the terminal shows every host
    job, problems = validate(spec, LocalProbe(try_target=tried_by_run, try_module=tried_by_run))
    if job is None:
        print(render_problems(problems), file=sys.stderr)
        return exits.INVALID
    if not 0 <= node < len(job.hosts):
        print(f"error: --ssh-host {node}: the spec has hosts 0..{len(job.hosts) - 1}", file=sys.stderr)
        return exits.INVALID
    paths = RunPaths(folder, spec.run_id or folder.name, attempt)
    plan = launcher.host_plan(job, paths, environment)
    paths.make()
    if not paths.spec.exists():  # a run folder of this host's own: say what the run is, as the launching `run` did
        write_atomically(paths.spec, spec_yaml(spec))  # (hosts that share it without `run` may both write it)
    share = HostShare(plan=plan, node_rank=node, paths=paths, environment=environment,
                      restarts=0 if spec.preflight else spec.launcher.max_restarts)
    # its reports go to the launching `run`, which takes them out of what it shows
    watch: list[DriverWatch] = []
    agent = HostAgent(share, early_stop=early_stop, reporter=say_report,
                      on_signal=lambda signum: _leaving(signum, watch, declares_elasticity(spec)))
    hard_stop_s = max(0.0, spec.launcher.grace_s) + FAILURE_STOP_S + HARD_STOP_MARGIN_S
    watch.append(DriverWatch(stream, agent, hard_stop_s, spec.launcher.ssh.keepalive_s))
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
    _say("SIGTERM to this host's `run`: it leaves the job (a preempted machine); the others go on without it")
    say_report(Leaving(at=time.time()))


def _arguments(argv: list[str]) -> tuple[int, Path, int] | None:
    """``<node rank> <run folder> [--attempt N]``: the node rank, the folder and the first attempt; None: not that."""
    if len(argv) == 4 and argv[2] == "--attempt" and argv[3].isdigit():
        argv, attempt = argv[:2], int(argv[3])
    else:
        attempt = 0
    if len(argv) != 2 or not argv[0].isdigit():
        return None
    return int(argv[0]), Path(argv[1]), attempt


def main(argv: list[str]) -> None:
    """``run --ssh-host <node rank> <run folder> [--attempt N]`` (runner.app.cli hands it these arguments)."""
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, _until_agent)
    early_stop = StopRequest()
    early_stop.install(signal.SIGUSR1)  # the default stop signal, early: the agent passes it on once it runs
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)  # until the agent runs (run_share): host 0's then answers Ctrl-\
    found = _arguments(argv)
    if found is None:
        print(USAGE, file=sys.stderr)
        code = exits.INVALID
    else:
        node, folder, attempt = found
        code = run_share(node, folder, sys.stdin.buffer, ProcessEnvironment.read(), early_stop, attempt)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
