"""The zygote: a fresh interpreter that imports torch once and forks every rank of its host from there.

A rank must be a fresh process: a script cannot tell it from a torchrun worker (``python -u script.py``) that
imported torch. A rank forked from its host agent was a copy of whatever the agent held at that moment (what it had
imported, `run`'s own state, its random streams), and that showed: every rank drew the same unseeded numbers, and
ordinary DDP scripts hung at their end once the agent had imported ``torch._dynamo`` for them (a script that imports
it first hangs the same way under torchrun: the GIL held by ``~ProcessGroupGloo`` while gloo's worker waits for it).

So the host agent starts this process by exec, as torchrun starts a worker, and it does one thing: it imports what
every rank imports (:data:`PRELOAD`, and nothing else of the runner's), starts no thread, never initialises CUDA, and
then forks a rank when the agent asks (:class:`Fork`), says how each ended (:class:`Exited`), tries a recipe target
for validation in a child of its own (:class:`TryTarget`), and forks the children that need torch for the agent:
host 0's store (:class:`ServeStore`) and a client of it for the job's channel (:class:`ServeChannel`), so that the
agent imports no torch. What each pre-import buys, and what was refused, is
measured by ``benchmarks/zygote_preload.py``. A rank takes a fresh process's random streams after the fork
(runner.worker.rank_process.become_rank).

Its processes: the zygote is a child of the agent in a session of its own (a terminal's Ctrl-C is the agent's to pass
on) and dies with it (``PR_SET_PDEATHSIG``); its ranks are its children and die with it. The agent's end
(:class:`Zygote`) and the zygote speak over a Unix socket: pickled messages, each with the file descriptors it
carries (a rank's pipes, its pidfd).
"""

from __future__ import annotations

import gc
import importlib
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from runner.worker.rank_process import become_rank, die_with_parent
from runner.worker.zygote_wire import receive, send

# What the zygote imports before it forks (a rank then starts with it imported, in pages it shares): torch (which
# imports numpy and torch.distributed: about 1.3 CPU-s a rank saves) and the rank's own code (0.2 CPU-s: the zygote
# needs it anyway to read the setup a rank is sent). Not torch._dynamo, which the DDP constructor and the first
# optimizer import (about 1 CPU-s a rank): ranks forked after it was imported hung at their end, 2 jobs of 16
# (benchmarks/zygote_preload.py; a script that imports it first hangs the same way under torchrun).
PRELOAD = ("torch", "runner.worker.rank", "runner.worker.script")
RANK_BODY = "runner.worker.rank:rank_main"
STORE_INDEX = -1  # the Forked that answers a ServeStore
CHANNEL_INDEX = -2  # ... and a ServeChannel
EXIT_WAIT_S = 10.0  # how long the agent waits for the zygote's word on a rank it has SIGKILLed
# what the zygote ignores: the signals that stop a job, which a scheduler sends every process of a job at once (Slurm's
# scancel --signal, its time-limit signal, mpirun's), and any other that would end it; its agent passes each on to the
# ranks as it should, and the zygote ends with its agent. (Its ranks take a fresh interpreter's dispositions.)
_DEAF_TO = tuple(s for s in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2,
                             signal.SIGALRM, signal.SIGVTALRM, signal.SIGPROF, signal.SIGIO, signal.SIGPWR, signal.SIGXCPU,
                             *range(signal.SIGRTMIN, signal.SIGRTMAX + 1)))
# -c put the current folder first on the path: a runner/ of the user's there is not ours
_BOOT = ("import sys; sys.flags.safe_path or sys.path.pop(0); from runner.worker.zygote import serve; "
         "serve(int(sys.argv[1]), int(sys.argv[2]))")


# -- the messages -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Fork:
    """Fork a rank that calls ``target(argument, events_fd)`` (``module:function``, imported with ``workdir`` first
    on the path) and exits with what it returns; its stdout, stderr and event pipe come with the message."""

    index: int
    target: str
    argument: Any
    workdir: str | None = None
    # signals the rank holds (blocked, so a signal sent meanwhile waits) from its fork until its body lets them through:
    # a recipe rank's stop request, which would otherwise end a rank that has not installed its handler yet
    held_signals: tuple[int, ...] = ()


@dataclass(frozen=True)
class Forked:
    """The rank of ``index`` runs as ``pid``; its pidfd comes with the message."""

    index: int
    pid: int


@dataclass(frozen=True)
class Exited:
    """A child of the zygote ended: its exit status (the code, or -N for signal N)."""

    pid: int
    code: int


@dataclass(frozen=True)
class TryTarget:
    """Validation asks whether a recipe target loads (runner.spec.targets.target_problem, in a child of the zygote)."""

    target: str
    workdir: str | None


@dataclass(frozen=True)
class ServeStore:
    """Serve host 0's rendezvous store from a child (runner.worker.store_server.serve) on the listening socket that
    comes with the message, saying on the pipe that comes with it when it serves; answered with a Forked of index
    -1 (and its pidfd)."""

    addr: str
    port: int
    timeout_s: float


@dataclass(frozen=True)
class ServeChannel:
    """Hold a client of host 0's store at ``addr:port`` in a child (runner.worker.channel_proxy.serve), which answers
    the agent's channel on the socket that comes with the message; answered with a Forked of index -2 (and its pidfd)."""

    addr: str
    port: int
    timeout_s: float


@dataclass(frozen=True)
class TargetAnswer:
    problem: Any  # a runner.spec.targets.TargetProblem, or None


class ZygoteGone(Exception):
    """The zygote ended (its reason is on the agent's stderr): no rank can be started."""


# -- the agent's end ----------------------------------------------------------------------------------------------
@dataclass
class RankProcess:
    """The agent's handle on one rank's process (a child of the zygote)."""

    index: int  # the rank's index among its host's processes here (its local rank, for a host's share)
    pid: int
    pidfd: int  # the process's, for signals that cannot reach another process that took its pid
    zygote: Zygote = field(repr=False)
    code: int | None = None  # its exit status once it has exited: the code, or -N for signal N
    signalled: list[int] = field(default_factory=list)  # what the agent sent it

    def reap(self, block: bool = False) -> int | None:
        """Its exit status if it has exited (``block``: once it has, within :data:`EXIT_WAIT_S`), else None. The
        zygote killed what it started in its session before it reaped it (its process group, while its own pid still
        held the group's number)."""
        if self.code is None:
            self.code = self.zygote.exit_code(self.pid, EXIT_WAIT_S if block else 0.0)
            if self.code is None and block:  # it did not end on SIGKILL: nothing more can be done from here
                self.code = -signal.SIGKILL
            if self.code is not None:
                os.close(self.pidfd)
        return self.code

    @property
    def running(self) -> bool:
        return self.reap() is None

    def kill(self) -> None:
        """SIGKILL to the rank and everything in its process group; reaped."""
        if self.code is None:
            self.send(signal.SIGKILL, group=True)
            self.reap(block=True)

    def send(self, signum: int, group: bool = False) -> None:
        """Send ``signum`` to the rank (``group``: and every process it started in its session, by its process
        group, which is its pid), unless it has exited."""
        if self.code is not None:
            return
        self.signalled.append(signum)
        try:
            if group:
                os.killpg(self.pid, signum)
            else:
                signal.pidfd_send_signal(self.pidfd, signum)
        except (ProcessLookupError, PermissionError):
            pass


class Zygote:
    """The agent's end of its zygote (see the module docstring). One per host agent, for all its attempts."""

    def __init__(self, process: subprocess.Popen, sock: socket.socket) -> None:
        self.process = process
        self._sock = sock
        self._codes: dict[int, int] = {}
        self._gone = False

    @classmethod
    def start(cls) -> Zygote:
        """Start the zygote; it imports :data:`PRELOAD` while the caller goes on (its first answer waits for that).
        Its command line, which its ranks keep (`ps` shows it), ends with the agent's own: ``run topology=1x2 ...``,
        ``... runner.app.task .../spec.yaml``."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        sys.stdout.flush()
        sys.stderr.flush()
        process = subprocess.Popen([sys.executable, "-u", "-c", _BOOT, str(os.getpid()), str(theirs.fileno()),
                                    *sys.argv], pass_fds=(theirs.fileno(),), start_new_session=True)
        theirs.close()
        return cls(process, ours)

    def fileno(self) -> int:
        """Readable when the zygote has something to say (a rank ended), for the agent's select."""
        return self._sock.fileno()

    def fork(self, index: int, fds: tuple[int, int, int], argument: Any, target: str = RANK_BODY,
             workdir: str | None = None, held_signals: tuple[int, ...] = ()) -> RankProcess:
        """Start a rank: ``target(argument, events_fd)`` with ``fds`` (its stdout, stderr and event pipe's write ends,
        which the caller still holds and closes) as its descriptors 1, 2 and its events; ``held_signals`` blocked in it
        from the fork on (:class:`Fork`). Raises ZygoteGone."""
        self._send(Fork(index, target, argument, workdir, tuple(int(s) for s in held_signals)), fds)
        while True:
            message, received = self._next(None)
            if isinstance(message, Forked) and message.index == index:
                return RankProcess(index, message.pid, received[0], self)

    def serve_store(self, addr: str, port: int, timeout_s: float, listen_fd: int, ready_w: int) -> tuple[int, int]:
        """Start host 0's store process (runner.worker.store_server); its pid and pidfd. Raises ZygoteGone."""
        self._send(ServeStore(addr, port, timeout_s), (listen_fd, ready_w))
        while True:
            message, received = self._next(None)
            if isinstance(message, Forked) and message.index == STORE_INDEX:
                return message.pid, received[0]

    def serve_channel(self, addr: str, port: int, timeout_s: float, sock_fd: int) -> tuple[int, int]:
        """Start a client of host 0's store for the agent's channel (runner.worker.channel_proxy); its pid and pidfd.
        Raises ZygoteGone."""
        self._send(ServeChannel(addr, port, timeout_s), (sock_fd,))
        while True:
            message, received = self._next(None)
            if isinstance(message, Forked) and message.index == CHANNEL_INDEX:
                return message.pid, received[0]

    def try_target(self, target: str, workdir: str | None) -> Any:
        """runner.spec.targets.target_problem, in a child of the zygote (which has torch imported, as the ranks
        will). Raises ZygoteGone."""
        self._send(TryTarget(target, workdir))
        while True:
            message, _ = self._next(None)
            if isinstance(message, TargetAnswer):
                return message.problem

    def target_problem(self, target: str, workdir: str | None) -> Any:
        """:meth:`try_target`; where the zygote is gone, tried from here (runner.spec.targets: a forked child of this
        process, which imports torch there if the target does)."""
        try:
            return self.try_target(target, workdir)
        except ZygoteGone:
            from runner.spec.targets import target_problem

            return target_problem(target, workdir)

    def exit_code(self, pid: int, wait_s: float = 0.0) -> int | None:
        """The exit status of the zygote's child ``pid``, once the zygote has said it (waiting up to ``wait_s``); a
        child of a zygote that has ended was killed with it (``PR_SET_PDEATHSIG``)."""
        deadline = time.monotonic() + wait_s
        while pid not in self._codes and not self._gone:
            left = deadline - time.monotonic()
            try:
                if self._next(max(0.0, left)) is None and left <= 0:
                    break
            except ZygoteGone:
                break
        if pid not in self._codes and self._gone:
            return -signal.SIGKILL
        return self._codes.get(pid)

    def close(self) -> None:
        """End the zygote (and whatever it still runs) and reap it."""
        self._gone = True
        try:
            self._sock.close()
        finally:
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait()

    def _send(self, message: object, fds: Sequence[int] = ()) -> None:
        try:
            send(self._sock, message, fds)
        except OSError as e:
            self._gone = True
            raise ZygoteGone(f"the zygote ended ({self._ended()})") from e

    def _next(self, wait_s: float | None) -> tuple[object, list[int]] | None:
        """The zygote's next message (an Exited is recorded here too); None when none came within ``wait_s``."""
        if self._gone:
            raise ZygoteGone(f"the zygote ended ({self._ended()})")
        if wait_s is not None:
            import select

            if not select.select([self._sock], [], [], wait_s)[0]:
                return None
        try:
            message, fds = receive(self._sock)
        except (EOFError, OSError) as e:
            self._gone = True
            raise ZygoteGone(f"the zygote ended ({self._ended()})") from e
        if isinstance(message, Exited):
            self._codes[message.pid] = message.code
        return message, fds

    def _ended(self) -> str:
        try:
            code = self.process.wait(timeout=1)
        except subprocess.TimeoutExpired:
            return "it stopped answering"
        return f"exit status {code}" if code >= 0 else f"killed by {signal.Signals(-code).name}"


# -- the zygote itself ----------------------------------------------------------------------------------------------
def serve(agent: int, fd: int) -> None:
    """The zygote's life (see the module docstring): never returns."""
    die_with_parent()
    if os.getppid() != agent:  # the agent died before we asked to die with it
        os._exit(1)
    for signum in _DEAF_TO:
        signal.signal(signum, signal.SIG_IGN)
    sys.argv = [""]
    sock = socket.socket(fileno=fd)
    for name in PRELOAD:
        importlib.import_module(name)
    # what it imported stays alive for every rank's life: out of the cyclic GC's full passes, which would otherwise
    # walk it again and again in every rank (and touch, so copy, its shared pages)
    gc.freeze()
    children: dict[int, int] = {}  # pidfd -> pid
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            if key.fileobj is sock:
                try:
                    message, fds = receive(sock)
                except (EOFError, OSError):  # the agent is gone: nothing of its host stays
                    for pid in children.values():
                        _kill_group(pid)
                    os._exit(0)
                _answer(sock, selector, children, message, fds)
            else:
                pidfd = key.fd
                pid = children.pop(pidfd)
                selector.unregister(pidfd)
                code = _reap(pid)
                os.close(pidfd)
                send(sock, Exited(pid, code))


def _answer(sock: socket.socket, selector: selectors.BaseSelector, children: dict[int, int], message: object,
            fds: list[int]) -> None:
    held = (sock.fileno(), selector.fileno(), *children)  # what a child must not keep of the zygote's
    if isinstance(message, (Fork, ServeStore, ServeChannel)):
        if isinstance(message, Fork):
            pid, index = _fork(message, fds, held), message.index
        elif isinstance(message, ServeStore):
            pid, index = _fork_store(message, fds, held), STORE_INDEX
        else:
            pid, index = _fork_channel(message, fds, held), CHANNEL_INDEX
        for f in fds:
            os.close(f)
        pidfd = os.pidfd_open(pid)
        children[pidfd] = pid
        selector.register(pidfd, selectors.EVENT_READ)
        send(sock, Forked(index, pid), [pidfd])
    elif isinstance(message, TryTarget):
        from runner.spec.targets import target_problem

        send(sock, TargetAnswer(target_problem(message.target, message.workdir)))


def _fork(message: Fork, fds: list[int], held: tuple[int, ...]) -> int:
    out_w, err_w, events_w = fds
    sys.stdout.flush()
    sys.stderr.flush()
    zygote = os.getpid()
    # blocked before the fork, so that the child holds them from its first instruction (here a held signal stays
    # pending, as the zygote ignores it, and is dropped once the mask is back)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, message.held_signals) if message.held_signals else None
    pid = os.fork()
    if pid == 0:  # the rank
        code = 70  # EX_SOFTWARE: the body did not return a status
        try:
            from runner.spec.targets import split_target, use_workdir

            use_workdir(message.workdir)
            module, function = split_target(message.target)
            body = getattr(importlib.import_module(module), function)
            code = become_rank(zygote, out_w, err_w, events_w, held, lambda events: body(message.argument, events),
                               blocked=message.held_signals)
        finally:
            os._exit(code)
    if mask is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return pid


def _fork_store(message: ServeStore, fds: list[int], held: tuple[int, ...]) -> int:
    listen_fd, ready_w = fds
    zygote = os.getpid()
    pid = os.fork()
    if pid == 0:  # the store's process
        try:
            from runner.worker.relay import close_fds
            from runner.worker.store_process import serve

            close_fds(held)
            serve(message.addr, listen_fd, message.port, message.timeout_s, ready_w, zygote)
        finally:
            os._exit(1)
    return pid


def _fork_channel(message: ServeChannel, fds: list[int], held: tuple[int, ...]) -> int:
    (sock_fd,) = fds
    zygote = os.getpid()
    pid = os.fork()
    if pid == 0:  # the agent's client of host 0's store
        try:
            from runner.worker.channel_process import serve
            from runner.worker.relay import close_fds

            close_fds(held)
            serve(sock_fd, message.addr, message.port, message.timeout_s, zygote)
        finally:
            os._exit(1)
    return pid


def _reap(pid: int) -> int:
    """The exit status of the zygote's child ``pid``, which has exited; what it started in its session is killed
    first (its process group, while its pid still holds the group's number)."""
    _kill_group(pid)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
