"""The ssh launch's running part: one ssh session per host, each host's `run` (runner.app.ssh_host) at the other end,
and this `run` as the job's one terminal.

* **Output.** Each host's stdout and stderr are relayed to this `run`'s, a whole line at a time (lines of two hosts
  never mix), as each host's agent writes them (``log.console`` chooses whose; ``all``: each line prefixed with its
  rank and host).
* **Signals.** The ssh clients run in a session of their own, so Ctrl-C reaches this `run` only; SIGINT, SIGTERM and
  the stop signal are passed to every host over its stdin (runner.launchers.ssh.protocol), where its `run` takes them
  as its own (and, through host 0's store, every host would anyway). Hosts still running ``launcher.grace_s`` +
  :data:`STOP_MARGIN_S` after a SIGINT or SIGTERM have their sessions closed (ssh terminated), which ends them (their
  stdin ends); a second Ctrl-C closes them at once. Ctrl-\\ (SIGQUIT) goes to host 0 alone, whose agent says where
  every rank of every host is (the hosts share no folder this `run` could read their dumps from).
* **Beats.** Every ``launcher.ssh.keepalive_s`` each host hears that this `run` is there; a host that stops hearing
  it (a network that drops everything: no connection closes) stops its share as if its stdin had ended.
* **A host lost.** An ssh that exits 255 (the connection lost, the host or its `run` killed) while the job runs:
  every other host is told to end the job (no restart: the lost host cannot take part), naming the lost host; the
  job fails (exit 1) and the summary names it, unless it outlives its hosts (topology.min_nodes, topology.spares),
  whose next attempt the launching `run` starts on the hosts that remain (runner.launchers.elastic.rounds). A host whose
  `run` ends badly (a refusal there, a lost store) while the others run is told to the others the same way.
* **A lost host back.** In such a job, a lost host that passes the check again (runner.launchers.ssh.rejoin) joins at
  the next checkpoint: every host is sent the stop signal, its ranks checkpoint and return, and the next round starts
  with it.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO

from runner.common import exits
from runner.common.signals import handling
from runner.launchers.elastic.rounds import Ended, Returns
from runner.launchers.ssh.host import SshHost
from runner.launchers.ssh.protocol import beat_message, end_message, signal_message, spec_message
from runner.worker.agent_reports import REPORT, AgentReport, AttemptBegan, StepReached, parse_report
from runner.worker.rank_process import die_with_parent

STOP_MARGIN_S = 25.0  # after launcher.grace_s: for the hosts to say where their ranks were, report and end
END_WAIT_S = 30.0  # after the job was ended (a host lost): for the others to stop their ranks and report
KILL_WAIT_S = 5.0  # after terminating an ssh client, before it is killed
TICK_S = 0.2
LOST = 255  # ssh's own failure, or the remote command killed by a signal
# how ssh itself says why a session ended (its stderr carries the host's too: these lines are ssh's)
_SSH_SAYS = re.compile(r"^(Connection to \S+ closed|Connection closed by|Timeout, server \S+ not responding|client_loop: |"
                       r"Read from remote host|packet_write_wait|ssh: |ssh_dispatch_run_fatal|Broken pipe)")


@dataclass
class Session:
    """One host's ssh session: its process, its output not yet relayed, and how it ended."""

    host: SshHost
    proc: subprocess.Popen
    partial: dict[int, bytearray] = field(default_factory=dict)  # its stream's fd -> a line begun
    stderr_tail: deque[str] = field(default_factory=lambda: deque(maxlen=20))
    code: int | None = None

    def tell(self, message: bytes) -> None:
        """Write ``message`` to the host's stdin; a session that is gone is told nothing (its exit says why)."""
        try:
            if self.proc.stdin is not None:
                os.write(self.proc.stdin.fileno(), message)
        except (BrokenPipeError, BlockingIOError, OSError, ValueError):
            pass


class Sessions:
    """Every host's session, from their start to the end of the last (see the module docstring)."""

    def __init__(self, hosts: tuple[SshHost, ...], spec_text: str, stop_signal: int, grace_s: float,
                 beat_s: float = 0.0, on_report: Callable[[int, AgentReport], None] | None = None,
                 returns: Returns | None = None, scripts: bool = False) -> None:
        self.hosts = hosts
        self.scripts = scripts  # the ranks run a script: the stop request is SIGTERM, a stop at any time (no steps said)
        self.returns = returns  # lost hosts tried again (runner.launchers.ssh.rejoin); started once the shares are
        self.joining: tuple[str, ...] = ()  # those that answered: every rank was asked to stop at its checkpoint
        self.stepping = False  # its ranks run and can be asked to stop: rank 0 took a step of this round (a recipe's
        # stop handler is in place), or, for a script, the attempt began (SIGTERM stops a script whenever it comes)
        self.joining_at: float | None = None
        self.on_report = on_report  # what each host reports (runner.launchers.ssh.protocol), with its index
        self.spec_text = spec_text
        self.stop_signal = stop_signal
        self.grace_s = grace_s
        self.beat_s = beat_s  # launcher.ssh.keepalive_s: how often each host hears that this `run` is there
        self.next_beat = time.monotonic() + beat_s
        self.sessions: list[Session] = []
        self.pending: list[int] = []  # signals to this `run`, not yet passed on
        self.signalled: int | None = None
        self.lost: dict[int, str] = {}  # host index -> why
        self.lost_at: float | None = None
        self.order: list[Session] = []  # sessions in the order they ended
        self.close_at: float | None = None  # when to close the sessions still open (a stop, the job ended)
        self.kill_at: float | None = None
        self.ending = False  # the hosts were told to end the job
        self.closing = False  # this `run` closed the sessions still open (their ssh then exits 255 or by the signal)
        self.selector = selectors.DefaultSelector()

    def run(self) -> Ended:
        wake_r, wake_w = os.pipe()
        for fd in (wake_r, wake_w):
            os.set_blocking(fd, False)
        previous = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        self.selector.register(wake_r, selectors.EVENT_READ, None)
        try:
            with handling((signal.SIGINT, signal.SIGTERM, self.stop_signal, signal.SIGQUIT),
                          lambda s, _f: self.pending.append(s)):
                self._start()
                if self.returns is not None:
                    self.returns.start()
                while any(s.code is None or s.partial for s in self.sessions):
                    self._step()
        finally:
            signal.set_wakeup_fd(previous)
            for s in self.sessions:  # whatever happened above, no ssh client is left
                if s.proc.poll() is None:
                    s.proc.kill()
                    s.proc.wait()
            self.selector.close()
            os.close(wake_r)
            os.close(wake_w)
        return self._ended()

    def _start(self) -> None:
        message = spec_message(self.spec_text)
        for host in self.hosts:
            # a session of its own: Ctrl-C on the terminal reaches this `run`, which passes it on over stdin
            # and it dies with this `run` (SIGKILL included): the connection closes, so the host's `run` sees its
            # stdin end and stops its share; no ssh client is left here waiting on a host
            proc = subprocess.Popen(host.start, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True, bufsize=0, preexec_fn=_die_with_run)
            session = Session(host, proc)
            self.sessions.append(session)
            for stream in (proc.stdout, proc.stderr):
                assert stream is not None
                os.set_blocking(stream.fileno(), False)
                session.partial[stream.fileno()] = bytearray()
                self.selector.register(stream.fileno(), selectors.EVENT_READ, (session, stream))
            session.tell(message)
            assert proc.stdin is not None
            os.set_blocking(proc.stdin.fileno(), False)  # a host that reads nothing never blocks this `run`

    # -- one step of the loop -------------------------------------------------------------------------------------
    def _step(self) -> None:
        for key, _ in self.selector.select(TICK_S):
            if key.data is None:
                try:
                    os.read(key.fd, 4096)  # the signal wake-up: the handler queued it
                except (BlockingIOError, OSError):
                    pass
            else:
                self._relay(*key.data)
        while self.pending:
            self._signalled(self.pending.pop(0))
        for s in self.sessions:
            if s.code is None and s.proc.poll() is not None:
                self._ended_session(s, s.proc.returncode)
        self._joins()
        now = time.monotonic()
        if self.beat_s and now >= self.next_beat:
            self.next_beat = now + self.beat_s
            for s in self.sessions:
                if s.code is None:
                    s.tell(beat_message())
        if self.close_at is not None and now >= self.close_at:
            self.close_at = None
            self._close(signal.SIGTERM)
            self.kill_at = now + KILL_WAIT_S
        if self.kill_at is not None and now >= self.kill_at:
            self.kill_at = None
            self._close(signal.SIGKILL)

    def _joins(self) -> None:
        """Lost hosts that answer again: every rank is asked to stop at its next checkpoint (the stop signal, as
        ``kill -USR1`` to each host's `run`), so that the next round starts with them; once the ranks can be asked
        (:attr:`stepping`), and not while the job ends."""
        if self.returns is None or self.joining or not self.stepping or self.ending or self.signalled is not None \
                or self.closing:
            return
        back = self.returns.ready()
        if not back:
            return
        self.joining, self.joining_at = back, time.time()
        print(f"ssh: {', '.join(back)} ready: the job takes {'them' if len(back) > 1 else 'it'} in at the next "
              f"checkpoint (every rank is asked to stop there)", file=sys.stderr, flush=True)
        for s in self.sessions:
            if s.code is None:
                s.tell(signal_message(self.stop_signal))

    def _relay(self, session: Session, stream: IO[bytes]) -> None:
        fd = stream.fileno()
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        buffer = session.partial[fd]
        out = 1 if stream is session.proc.stdout else 2
        if not data:  # the end of the stream: what is left of its last line
            self.selector.unregister(fd)
            del session.partial[fd]
            if buffer:
                _write(out, bytes(buffer) + b"\n")
            return
        buffer += data
        cut = buffer.rfind(b"\n") + 1
        if cut:
            whole = bytes(buffer[:cut])
            del buffer[:cut]
            if out == 2:
                whole = self._reports_taken(session, whole)
                session.stderr_tail.extend(line for line in whole.decode(errors="replace").splitlines() if line.strip())
            if whole:
                _write(out, whole)

    def _reports_taken(self, session: Session, lines: bytes) -> bytes:
        """A host's stderr without its report lines, which go to :attr:`on_report` instead."""
        if REPORT not in lines:
            return lines
        kept = []
        for line in lines.splitlines(keepends=True):
            report = parse_report(line)
            if report is None:
                kept.append(line)
                continue
            if isinstance(report, StepReached) and (report.resumed is None or report.step > report.resumed) \
                    or isinstance(report, AttemptBegan) and self.scripts:
                self.stepping = True
            if self.on_report is not None:
                self.on_report(session.host.index, report)
        return b"".join(kept)

    def _signalled(self, signum: int) -> None:
        running = [s for s in self.sessions if s.code is None]
        if signum == signal.SIGQUIT:  # where the ranks are: host 0's agent says it, for every host
            running = [s for s in running if s.host.index == 0]
        elif signum in (signal.SIGINT, signal.SIGTERM):
            if self.signalled is not None:  # the second: close the sessions now
                self._close(signal.SIGTERM)
                self.kill_at = time.monotonic() + KILL_WAIT_S
                return
            self.signalled = signum
            self.close_at = time.monotonic() + self.grace_s + STOP_MARGIN_S
        for s in running:
            s.tell(signal_message(signum))

    def _ended_session(self, session: Session, code: int) -> None:
        session.code = code if code >= 0 else exits.from_signal(-code)
        self.order.append(session)
        if code == 0 or self.signalled is not None or self.closing:
            return
        host = session.host
        if code == LOST or code < 0:
            said = next((f" ({line})" for line in reversed(session.stderr_tail) if _SSH_SAYS.match(line)), "")
            how = f"exited {code}" if code >= 0 else f"was killed by {signal.Signals(-code).name}"
            self.lost[host.index] = f"ssh {how}{said}: the host, its network or its `run` is gone"
            self.lost_at = self.lost_at or time.time()
            print(f"\nssh: {host.label} lost: {self.lost[host.index]}", file=sys.stderr, flush=True)
            why = f"lost: {self.lost[host.index]}"
        else:
            why = f"its `run` ended with exit {code}"
        others = [s for s in self.sessions if s.code is None]
        if others and not self.ending:
            self.ending = True
            print(f"ssh: ending the job on {', '.join(s.host.label for s in others)}", file=sys.stderr, flush=True)
            for s in others:
                s.tell(end_message(host.name, why))
            self.close_at = time.monotonic() + END_WAIT_S

    def _close(self, signum: int) -> None:
        self.closing = True
        for s in self.sessions:
            if s.proc.poll() is None:
                try:
                    s.proc.send_signal(signum)  # ssh ends the session: the host's `run` sees its stdin end
                except ProcessLookupError:
                    pass

    def _ended(self) -> Ended:
        lost = frozenset(self.lost)
        cause = next((f"{s.host.label} was lost: {self.lost[s.host.index]}" for s in self.order
                      if s.host.index in self.lost), None)
        codes = [s.code for s in self.order if s.code]
        if self.signalled is not None:
            code = exits.from_signal(self.signalled) if codes else exits.OK
        elif lost:
            code = exits.FAILED
        else:
            code = codes[0] if codes else exits.OK
        return Ended(code, self.signalled, cause, lost, self.lost_at, dict(self.lost), joining=self.joining,
                     joining_at=self.joining_at)


def _die_with_run() -> None:
    """In the ssh client, before it runs: SIGTERM when this `run` dies."""
    die_with_parent(signal.SIGTERM)


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            time.sleep(0.01)
        except OSError:  # our own terminal is gone: the job goes on, unseen
            return


def run_sessions(hosts: tuple[SshHost, ...], spec_text: str, stop_signal: int, grace_s: float,
                 beat_s: float = 0.0, on_report: Callable[[int, AgentReport], None] | None = None,
                 returns: Returns | None = None, scripts: bool = False) -> Ended:
    """Start every host's share over ssh and relay it to its end (the module docstring); ``on_report``: what the
    hosts report as it comes; ``returns``: lost hosts tried again, that join at the next checkpoint (``scripts``: the
    ranks run a script)."""
    return Sessions(hosts, spec_text, stop_signal, grace_s, beat_s, on_report, returns, scripts).run()
