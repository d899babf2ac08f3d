"""How the hosts of a launcher=manual job that outlives its hosts (topology.min_nodes, topology.spares) agree on who
goes on, with no `run` that holds the job.

Every host's `run` serves a **meeting point** (:class:`MeetingPoint`) from its start to its end: a small TCP server
at the host's own address, on a port every host derives from the run id (:func:`meeting_port`), answering one line
of JSON with one line of JSON. Its peers look at it to know the host's `run` is alive (runner.launchers.manual.watch),
a host whose share ended not to meet again says so at its peers' points before it leaves (:func:`say_farewell`), and
the hosts meet at one of them after an attempt ends. A spare's `run` serves one too, and waits there to be called.

**The meeting** of an attempt (:func:`meet`), once the attempt has ended on a host (a rank failed, or a peer was
lost): the attempt's hosts, in host order, are the candidates to chair it; each host goes to the first candidate that
answers, and a host that is itself that candidate chairs. The chair waits until each of the attempt's hosts has come
or is lost: its point refuses (its `run` is gone) or has not answered for the silence window (its machine or network
is gone), or it answered but did not come for :attr:`Windows.come_s`. Then it decides (:class:`Decision`): those who
came go on from the next attempt when they are more than half of the attempt's hosts, or exactly half with the
attempt's host 0 among them — two halves cut apart cannot both go on, so a host cut off from the others ends instead
of training alone. Where hosts were lost, the chair calls in spares in their places: the first that answer, in
order (:class:`Call`). Every host that learns the decision keeps it at its own point too, for a host that comes late
(it learns that the others went on without it, and ends).
"""

from __future__ import annotations

import dataclasses
import json
import socket
import socketserver
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from runner.common.polling import poll
from runner.plan.processes import port_for

ASK_S = 1.0  # how long a question to a point may take (connect and answer)
LOOK_S = 0.2  # how often a meeting's state is looked at again


def meeting_port(run_id: str) -> int:
    """The port of every host's meeting point of run ``run_id`` (each at its own address)."""
    return port_for(f"{run_id}.meeting")


@dataclass(frozen=True)
class Peer:
    """A host of an attempt, as the meeting knows it: its label (name, else address) and where its point is."""

    label: str
    addr: str


@dataclass(frozen=True)
class Windows:
    """How long a meeting waits: ``silent_s`` for a point that does not answer (then its host is lost), ``come_s`` for
    a host that answers but does not come (its share still ending)."""

    silent_s: float
    come_s: float


@dataclass(frozen=True)
class Decision:
    """What the chair of meeting ``meeting`` (the attempt that ended) decided: the hosts that go on from ``attempt``
    (the next), in the attempt's host order, then the spares it called in; those lost and why; or why the job ends
    for those who came (``ended``)."""

    meeting: int
    attempt: int
    went_on: tuple[str, ...]
    lost: dict[str, str] = field(default_factory=dict)
    ended: str | None = None
    chair: str = ""
    spares_taken: tuple[str, ...] = ()  # spares called in, in the lost hosts' places (after those who came)
    spares_gone: dict[str, str] = field(default_factory=dict)  # spares that did not answer, and why: dropped

    def document(self) -> dict[str, Any]:
        return {**asdict(self), "went_on": list(self.went_on), "spares_taken": list(self.spares_taken)}

    @classmethod
    def from_document(cls, doc: object) -> Decision | None:
        if not isinstance(doc, dict) or not isinstance(doc.get("meeting"), int):
            return None
        return cls(meeting=doc["meeting"], attempt=int(doc.get("attempt") or 0),
                   went_on=tuple(str(h) for h in doc.get("went_on") or ()),
                   lost={str(k): str(v) for k, v in (doc.get("lost") or {}).items()},
                   ended=doc.get("ended"), chair=str(doc.get("chair") or ""),
                   spares_taken=tuple(str(h) for h in doc.get("spares_taken") or ()),
                   spares_gone={str(k): str(v) for k, v in (doc.get("spares_gone") or {}).items()})


@dataclass(frozen=True)
class Call:
    """A spare called in by the chair of a meeting: the hosts of the attempt it joins (it among them), from which
    attempt, and the spares still kept ready after it."""

    attempt: int
    hosts: tuple[str, ...]
    spares: tuple[str, ...]

    @classmethod
    def from_document(cls, doc: object) -> Call | None:
        if not isinstance(doc, dict) or not isinstance(doc.get("attempt"), int):
            return None
        return cls(attempt=doc["attempt"], hosts=tuple(map(str, doc.get("hosts") or ())),
                   spares=tuple(map(str, doc.get("spares") or ())))


class MeetingPoint:
    """This host's meeting point (the module docstring): who came to each meeting (label -> when),
    the decisions known, and the peers that said farewell. Served by a thread of `run` until :meth:`close`."""

    def __init__(self, run_id: str, label: str, addr: str, port: int) -> None:
        self.run_id, self.label, self.port = run_id, label, port
        self._lock = threading.Lock()
        self._came: dict[int, dict[str, float]] = {}  # meeting -> label -> when it came
        self._decisions: dict[int, Decision] = {}
        self.farewells: set[str] = set()
        self._told: dict[int, set[str]] = {}  # meeting -> the hosts told its decision
        self.call: Call | None = None  # a spare's: the call that takes it in
        self.woken = threading.Event()  # a call or a farewell came
        point = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                self.connection.settimeout(ASK_S * 5)
                try:
                    answer = point.answer(json.loads(self.rfile.readline() or b"null"))
                    self.wfile.write(json.dumps(answer).encode() + b"\n")
                except (OSError, ValueError):
                    pass

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self._server = socketserver.ThreadingTCPServer((addr, port), Handler, bind_and_activate=False)
        self._server.daemon_threads = True
        self._server.request_queue_size = 128  # every peer's questions at once (socketserver's default backlog is 5)

    def start(self) -> MeetingPoint:
        """Bind and serve; raises OSError where the port is taken."""
        try:
            self._server.server_bind()
            self._server.server_activate()
        except OSError:
            self._server.server_close()
            raise
        self.port = self._server.server_address[1]  # (the one asked for; port 0: the kernel's choice)
        threading.Thread(target=self._server.serve_forever, args=(0.2,), name="runner-meeting-point",
                         daemon=True).start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def answer(self, asked: object) -> dict[str, Any]:
        if not isinstance(asked, dict) or asked.get("run") != self.run_id:
            return {"error": "not this run"}
        op, meeting, host = asked.get("op"), asked.get("meeting"), str(asked.get("host"))
        with self._lock:
            if op == "join" and isinstance(meeting, int):
                self._came.setdefault(meeting, {})[host] = time.time()
            elif op == "farewell":
                self.farewells.add(host)
                self.woken.set()
            elif op == "call" and self.call is None:
                self.call = Call.from_document(asked.get("call"))
                self.woken.set()
            decided = self._decisions.get(meeting) if isinstance(meeting, int) else None
            if decided is not None:
                self._told.setdefault(meeting, set()).add(host)
        return {"host": self.label, "decision": decided.document() if decided else None}

    def told(self, meeting: int) -> set[str]:
        """The hosts that have heard meeting ``meeting``'s decision here."""
        with self._lock:
            return set(self._told.get(meeting, ()))

    def came(self, meeting: int) -> dict[str, float]:
        with self._lock:
            return dict(self._came.get(meeting, {}))

    def keep(self, decision: Decision) -> None:
        with self._lock:
            self._decisions.setdefault(decision.meeting, decision)

    def join(self, meeting: int) -> None:
        self.answer({"run": self.run_id, "op": "join", "meeting": meeting, "host": self.label})


def ask(addr: str, port: int, message: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """One question to the point at ``addr:port``: its answer, or None and why there was none ("refused": no `run`
    serves it there; "silent": no answer within :data:`ASK_S`)."""
    try:
        with socket.create_connection((addr, port), timeout=ASK_S) as conn:
            conn.settimeout(ASK_S)
            conn.sendall(json.dumps(message).encode() + b"\n")
            line = conn.makefile("rb").readline()
    except ConnectionRefusedError:
        return None, "refused"
    except OSError:
        return None, "silent"
    try:
        answer = json.loads(line)
    except ValueError:
        return None, "silent"
    return (answer, "") if isinstance(answer, dict) and "error" not in answer else (None, "refused")


def say_farewell(point: MeetingPoint, peers: list[Peer]) -> None:
    """This host's share ended, not to meet again (done, or stopped): its peers' watches are not to take its point's
    going as a loss, and a spare waiting among ``peers`` learns that the job is over."""
    for peer in peers:
        if peer.label != point.label:
            ask(peer.addr, point.port, {"run": point.run_id, "op": "farewell", "host": point.label})


def meet(point: MeetingPoint, peers: list[Peer], meeting: int, windows: Windows,
         known_lost: dict[str, str] | None = None, spares: list[Peer] | None = None) -> Decision:
    """This host at meeting ``meeting`` of ``peers`` (the attempt's hosts, in host order; this host among them): the
    decision, from the first candidate that answers, or its own as chair (the module docstring). ``known_lost``:
    peers this host's watch found lost already (label -> why), not waited for if it chairs (unless they come);
    ``spares``: the spares still kept ready, in order, which the chair calls in the lost hosts' places."""
    for candidate in peers:
        if candidate.label == point.label:
            decision = _chair(point, peers, meeting, windows, dict(known_lost or {}))
            if decision.ended is None and decision.lost and spares:
                decision = _call_spares(point, decision, len(peers), spares)
            point.keep(decision)
            # every host that came hears it before this `run` may leave (the job may end here, its point with it)
            came = set(point.came(meeting)) - {point.label}
            poll(lambda: point.told(meeting), lambda told: came <= told, windows.silent_s, LOOK_S)
            return decision
        decision = _follow(point, candidate, meeting, windows)
        if decision is not None:
            point.keep(decision)
            return decision
    raise ValueError(f"{point.label} is none of the meeting's hosts {[p.label for p in peers]}")


def _follow(point: MeetingPoint, chair: Peer, meeting: int, windows: Windows) -> Decision | None:
    """Come to ``chair``'s meeting and wait for its decision; None where it is not there (refused, or silent for the
    silence window) or decides nothing in time (then the next candidate is asked)."""
    came = {"run": point.run_id, "op": "join", "meeting": meeting, "host": point.label}
    heard = started = time.monotonic()
    while time.monotonic() - started < windows.come_s + 2 * windows.silent_s:
        answer, why = ask(chair.addr, point.port, came)
        if answer is not None:
            heard = time.monotonic()
            if (decision := Decision.from_document(answer.get("decision"))) is not None:
                return decision
        elif why == "refused" or time.monotonic() - heard >= windows.silent_s:
            return None
        time.sleep(LOOK_S)
    return None


def _chair(point: MeetingPoint, peers: list[Peer], meeting: int, windows: Windows, lost: dict[str, str]) -> Decision:
    point.join(meeting)
    started = time.monotonic()
    heard = {p.label: started for p in peers}
    while True:
        came = point.came(meeting)
        waiting = [p for p in peers if p.label not in came and p.label not in lost]
        if not waiting:
            break
        now = time.monotonic()
        for peer in waiting:
            answer, why = ask(peer.addr, point.port, {"run": point.run_id, "op": "ping", "host": point.label})
            if answer is not None:
                heard[peer.label] = now
            if why == "refused":
                lost[peer.label] = "its `run` is gone (its meeting point refuses)"
            elif now - heard[peer.label] >= windows.silent_s:
                lost[peer.label] = f"no answer for {windows.silent_s:g} s (its machine or its network is gone)"
            elif now - started >= windows.come_s:
                lost[peer.label] = f"alive, but it did not come to the meeting within {windows.come_s:g} s"
        time.sleep(LOOK_S)
    return decide(peers, came, lost, meeting, point.label)


def _call_spares(point: MeetingPoint, decision: Decision, hosts: int, spares: list[Peer]) -> Decision:
    """The decision with spares in the lost hosts' places: the first that answer, in order (those that do not are
    dropped), each called in (:class:`Call`), as runner.launchers.elastic.membership takes them."""
    taken: list[Peer] = []
    gone: dict[str, str] = {}
    for spare in spares:
        if len(taken) == hosts - len(decision.went_on):
            break
        answer, why = ask(spare.addr, point.port, {"run": point.run_id, "op": "ping", "host": point.label})
        if answer is None:
            gone[spare.label] = "its `run` is gone (its meeting point refuses)" if why == "refused" else "no answer"
        else:
            taken.append(spare)
    left = [s.label for s in spares if s.label not in gone and s not in taken]
    call = {"attempt": decision.attempt, "hosts": [*decision.went_on, *(s.label for s in taken)], "spares": left}
    for spare in taken:  # one that does not take the call is found lost in the next attempt, by the watch
        ask(spare.addr, point.port, {"run": point.run_id, "op": "call", "host": point.label, "call": call})
    return dataclasses.replace(decision, spares_taken=tuple(s.label for s in taken), spares_gone=gone)


def decide(peers: list[Peer], came: dict[str, float], lost: dict[str, str], meeting: int, chair: str) -> Decision:
    """The chair's decision (the module docstring's rule): those who came go on, or the job ends for them."""
    went_on = tuple(p.label for p in peers if p.label in came)
    lost = {label: why for label, why in lost.items() if label not in came}  # (one that came after all is not)
    attempt = meeting + 1
    if 2 * len(went_on) > len(peers) or (2 * len(went_on) == len(peers) and peers[0].label in went_on):
        return Decision(meeting=meeting, attempt=attempt, went_on=went_on, lost=dict(lost), chair=chair)
    why = (f"only {len(went_on)} of the attempt's {len(peers)} hosts reached each other ({', '.join(went_on)}): not "
           f"more than half, so the others may go on without them")
    return Decision(meeting=meeting, attempt=attempt, went_on=(), lost=dict(lost), ended=why, chair=chair)
