"""launcher=manual, a job that outlives its hosts: each host's `run` watches its peers' meeting points
(runner.launchers.manual.meeting) while an attempt runs, so that a lost host ends the attempt on every other host
within seconds, whether it closed its connections (its `run` killed: its point refuses) or went silent (its machine
or its network gone: no answer), and not only once a collective times out.

A peer is asked every ``launcher.manual.keepalive_s``; one that answered once (hosts started by hand come when they
come) and then has not answered for :data:`BEATS_MISSED` intervals, or whose point refused :data:`REFUSALS` times in a
row (nothing listens there: its `run` is gone, since a `run` whose share ends any other way either stays for the
meeting or says farewell first), is lost: the host's agent ends its share at once with that cause
(HostAgent.end_job), which it also says on the job's channel. A peer that said farewell is not watched any more.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from runner.launchers.manual.meeting import MeetingPoint, Peer, ask

BEATS_MISSED = 4  # keepalive intervals a peer may miss before it is lost
REFUSALS = 2  # ... or times in a row its point may refuse (a second look: one refusal may be a moment's)


class PeerWatch:
    """A thread asking ``peers`` (this host's among them, left out) every ``every_s``, from :meth:`start` to
    :meth:`stop`; ``lost`` gets each lost peer's label and why, once. ``seen``: peers taken as alive from the start (a
    later attempt's hosts came to the meeting that chose them)."""

    def __init__(self, point: MeetingPoint, peers: list[Peer], every_s: float,
                 lost: Callable[[str, str], None], seen: bool) -> None:
        self.point, self.every_s, self.lost = point, every_s, lost
        self.peers = [p for p in peers if p.label != point.label]
        now = time.monotonic()
        self.heard: dict[str, float] = {p.label: now for p in self.peers} if seen else {}
        self.gone: set[str] = set()
        self.refused: dict[str, int] = {}  # peer -> refusals in a row
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="runner-peer-watch", daemon=True)

    @property
    def silent_s(self) -> float:
        return BEATS_MISSED * self.every_s

    def start(self) -> PeerWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.wait(self.every_s):
            for peer in self.peers:
                if peer.label not in self.gone and peer.label not in self.point.farewells:
                    self._ask(peer)

    def _ask(self, peer: Peer) -> None:
        point = self.point
        answer, why = ask(peer.addr, point.port, {"run": point.run_id, "op": "ping", "host": point.label})
        now = time.monotonic()
        if answer is not None:
            self.heard[peer.label] = now
            self.refused.pop(peer.label, None)
            return
        since = self.heard.get(peer.label)
        refused = self.refused[peer.label] = self.refused.get(peer.label, 0) + 1 if why == "refused" else 0
        if since is None or self._stop.is_set():
            return
        if refused >= REFUSALS:
            self._lose(peer, "its `run` is gone (its meeting point refuses)")
        elif now - since >= self.silent_s:
            self._lose(peer, f"no answer for {self.silent_s:g} s (launcher.manual.keepalive_s={self.every_s:g}): its "
                             f"machine or network is gone")

    def _lose(self, peer: Peer, why: str) -> None:
        self.gone.add(peer.label)
        self.lost(peer.label, why)
