"""launcher=ssh takes lost hosts back (topology.max_nodes), and spares that were not ready at the start: while a round
runs, a thread of the launching `run` tries each such host every ``launcher.ssh.rejoin_s`` with the check of the start
(runner.launchers.ssh.check: ssh logs in, `run` is there with this machine's runner and torch, the job's folder is
there, and host 0's rendezvous is reached from it), from when launcher.rejoin_after_s allows it. Those that pass and
join are :meth:`ReturnWatch.ready`: the session then asks every rank to stop at its next checkpoint
(runner.launchers.ssh.session), and the next round starts with them (runner.launchers.elastic.rounds); a spare that
passes where the job has its most hosts is only kept ready (:meth:`ReturnWatch.spares`). Nothing it starts outlives
:meth:`ReturnWatch.close`."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from runner.environments.versions import Versions
from runner.launchers.ssh.check import ANSWER_S, verdict
from runner.launchers.ssh.host import SshHost


@dataclass(frozen=True)
class Returning:
    """A host as the watch tries it (a lost one, or a spare not ready at the start): ``key`` is how the membership names
    it, ``due`` when it may first be tried (time.time())."""

    key: str
    host: SshHost
    due: float
    joins: bool = True  # it joins once it answers (else it is a spare, only kept ready: :meth:`ReturnWatch.spares`)


class ReturnWatch:
    """The lost hosts tried again in a thread of its own (the module docstring)."""

    def __init__(self, hosts: Sequence[Returning], every_s: float, connect_timeout_s: float, here: Versions,
                 clock: Callable[[], float] = time.time) -> None:
        self.hosts = tuple(hosts)
        self.every_s = every_s
        self.timeout_s = connect_timeout_s + ANSWER_S
        self.here = here
        self.clock = clock
        self._ready: tuple[str, ...] = ()
        self._spares: tuple[str, ...] = ()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._trying: subprocess.Popen | None = None
        self._thread = threading.Thread(target=self._watch, name="ssh-rejoin", daemon=True)

    def start(self) -> ReturnWatch:
        if self.hosts and self.every_s > 0:
            self._thread.start()
        return self

    def ready(self) -> tuple[str, ...]:
        """The keys of the hosts that passed the check and join (empty: none yet)."""
        with self._lock:
            return self._ready

    def spares(self) -> tuple[str, ...]:
        """The keys of the spares that passed the check and are kept ready (they join nothing by themselves)."""
        with self._lock:
            return self._spares

    def close(self) -> None:
        """Stop trying: a check under way is killed, and the thread waited for."""
        self._closed.set()
        with self._lock:
            trying = self._trying
        if trying is not None and trying.poll() is None:
            trying.kill()
        if self._thread.is_alive():
            self._thread.join(timeout=self.timeout_s)

    def _watch(self) -> None:
        left = list(self.hosts)
        while left and not self._closed.wait(self.every_s):
            now = self.clock()
            passed = [r for r in left if r.due <= now and self._passes(r.host)]
            left = [r for r in left if r not in passed]
            with self._lock:
                self._spares = (*self._spares, *(r.key for r in passed if not r.joins))
                self._ready = tuple(r.key for r in passed if r.joins)
            if self._ready:
                return  # the round stops for them: the next round's watch tries the others

    def _passes(self, host: SshHost) -> bool:
        """One try of ``host``'s check, killed if it takes longer than the check of the start may."""
        with self._lock:
            if self._closed.is_set():
                return False
            self._trying = subprocess.Popen(host.check, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = self._trying.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            self._trying.kill()
            self._trying.communicate()
            return False
        finally:
            with self._lock:
                code, self._trying = self._trying.returncode, None
        return not self._closed.is_set() and verdict(host, code, out, err, self.here) is None
