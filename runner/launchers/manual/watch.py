"""launcher=manual, a job that outlives its hosts: while an attempt runs, each host's `run` watches the others' leases
in the job's etcd (runner.launchers.elastic.decisions; its own is kept alive by the Decider from start to end), so
that a lost host ends the attempt on every other host within seconds, and not only once a collective times out.

Every ``launcher.manual.keepalive_s`` the watch reads the hosts' member keys: a peer of the attempt whose key is gone
(its lease expired: its `run`, its machine or its network gone; or it says ``returning``: its `run` was started
again) and stays gone for :data:`~runner.launchers.elastic.decisions.BACK_WITHIN_BEATS` intervals (a host whose kept
lease etcd revoked puts its key back within them) is lost, once (``lost`` gets its label and why: the host's agent
ends its share at once: HostAgent.end_job); after each look, ``also`` (the joins' part:
runner.launchers.manual.joins). This host is out of the job where its own lease expired, where etcd has not answered
it for the lease's time, or where a decision for the next attempt exists already (the others went on without it):
its share ends then too (``out``). Once the job is over (a host said it was done or stopped), nobody is lost any
more.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from runner.launchers.elastic.decisions import Decider, Decision
from runner.launchers.elastic.etcd import EtcdError


class LeaseWatch:
    """A thread watching the attempt ``attempt`` of ``hosts`` (labels; this host's among them) from :meth:`start` to
    :meth:`stop`, every ``decider.every_s``."""

    def __init__(self, decider: Decider, hosts: list[str], attempt: int, lost: Callable[[str, str], None],
                 out: Callable[[str], None], also: Callable[[], None] | None = None) -> None:
        self.decider, self.attempt, self.lost, self.out, self.also = decider, attempt, lost, out, also
        self.peers = [h for h in hosts if h != decider.label]
        self.gone: set[str] = set()
        self.missing: dict[str, float] = {}  # peer -> when its key was first seen gone (it may come back)
        self.following: Decision | None = None  # the decision that left this host out, where the watch saw it
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="runner-lease-watch", daemon=True)

    def start(self) -> LeaseWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.wait(self.decider.every_s):
            why = self.look()
            if why is not None:
                self.out(why)
                return
            if self.also is not None:
                self.also()

    def look(self) -> str | None:
        """One look: lost peers said; why this host is out, if it is."""
        decider = self.decider
        if decider.out is not None:  # (its lease is kept alive by a thread of its own: Decider)
            return decider.out
        try:
            if decider.is_over() is not None:
                return None
            alive = decider.members.alive() | decider.members.leaving(self.attempt)  # (a host that leaves is not lost)
            following = decider.decision(self.attempt + 1)
        except EtcdError:
            return None  # (beat says when etcd has been silent too long)
        if following is not None:
            self.following = following
            return (f"the other hosts went on to attempt {following.attempt + 1} "
                    f"({', '.join(following.hosts) or 'none'}) without this host's share of attempt {self.attempt + 1}")
        now = time.monotonic()
        for peer in self.peers:
            if peer in alive:
                self.missing.pop(peer, None)
                continue
            since = self.missing.setdefault(peer, now)
            if now - since >= decider.back_within_s and peer not in self.gone \
                    and not self._stop.is_set():
                self.gone.add(peer)
                self.lost(peer, f"its lease in the job's etcd expired ({decider.ttl_s} s without a keepalive): its "
                                f"`run`, its machine or its network is gone")
        return None
