"""Who is in each attempt of a launcher=manual job that outlives its hosts, decided in etcd, where it cannot split.

No `run` holds such a job: each host's `run` runs its own share, and they must agree, after an attempt ends, on who
goes on. They agree through etcd (runner.launchers.elastic.etcd: the job's own members, or the user's), whose writes
need a majority of its members: a side of a partition without that majority can neither decide nor learn a
decision, and ends. Under the prefix of the run id and the launch (runner.launchers.elastic.launch_keys.Keys):

* ``member/<host>`` — put with the host's lease, which its `run` keeps alive every ``launcher.manual.keepalive_s``;
  the lease lasts :data:`BEATS_MISSED` intervals. A host whose key is gone is lost (its `run`, machine or network)
  once it stays gone for :data:`BACK_WITHIN_BEATS` more intervals: etcd can revoke a lease its host kept alive (a
  member that led etcd and was paused, a frozen machine, revokes every lease by its own clock when it wakes:
  etcd-io/etcd#15247; 3.5.13's fix skips its check where the member ticks again at once), and such a host puts its
  key back, with a new lease, at its next keepalive;
* ``ended/<k>/<host>`` — the host's share of attempt k ended (``failed``; ``leaving``: SIGTERM to its `run`;
  ``left out``: the data-network check before the attempt named it, runner.worker.pair_check, or named it as the
  host that hung the two attempts before, runner.worker.hung_hosts; ``joining``: stopped at a checkpoint for a join);
* ``began/<k>/<host>`` — the host's ranks of attempt k started (the rendezvous of every host of it done): a host whose
  `run` starts again in a launch where its own ``began`` key is (it was in the job, and lost) comes back as
  ``returning`` (its member key says so: it is no host of the attempt that runs, and is not watched as one);
* ``joining/<k>`` — hosts coming back (``returning``) or spares, taken in at attempt k's next checkpoint: made once,
  by the host 0 of attempt k (the one that asks every rank to stop there), and never where the job is ``over``;
* ``attempt/<k+1>`` — **the decision** for the next attempt, made once: every host of attempt k that ended it tries to
  create it (one transaction: create only where absent) with what it sees, once every host of attempt k ended it,
  is gone, or did not end it within the come window; the first wins, and every host follows the decision that
  exists, never its own. The decision is the one model of rounds' (runner.launchers.elastic.membership): the hosts
  that came, in order, then the spares alive in the lost hosts' places, then those ``joining`` names that are up;
  the job ends where fewer than topology.min_nodes remain;
* ``over`` — the job ended on a host (done, stopped): a spare standing by stops, no peer counts as lost any more.

A launch of the run id is a number of its own (``launch/<n>``, made with its first host's member key in one
transaction): a relaunch after the last launch ended, or after every host of it is gone, starts the next one, so
no key of an earlier launch is read as this one's.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from runner.launchers.elastic.etcd import Etcd, EtcdError
from runner.launchers.elastic.launch_keys import Keys, Members
from runner.launchers.elastic.liveness import BEATS_MISSED, silent_after_s
from runner.launchers.elastic.membership import CannotGoOn, Membership, host_key
from runner.spec.schema import HostConfig

LOOK_S = 0.25  # how often a decider looks at etcd again while it waits
BACK_WITHIN_BEATS = 2  # keepalive intervals a host whose kept lease etcd revoked takes, at most, to put its key back


class AlreadyRunning(Exception):
    """A `run` of this host is in the job already (the message says so)."""


@dataclass(frozen=True)
class Decision:
    """The hosts of ``attempt`` (in node order), the spares still kept, those that took lost hosts' places, the lost
    hosts and why, the spares passed over (found gone), the hosts taken in at a checkpoint (``joined``, asked at
    ``joined_at``: time.time() of the host that asked), or why the job ends (``ended``); ``by``: the host that wrote
    it."""

    attempt: int
    hosts: tuple[str, ...]
    spares: tuple[str, ...] = ()
    taken: tuple[str, ...] = ()
    lost: dict[str, str] = field(default_factory=dict)
    spares_gone: tuple[str, ...] = ()
    ended: str | None = None
    by: str = ""
    joined: tuple[str, ...] = ()
    joined_at: float | None = None

    def document(self) -> str:
        return json.dumps({**asdict(self), "hosts": list(self.hosts), "spares": list(self.spares),
                           "taken": list(self.taken), "spares_gone": list(self.spares_gone),
                           "joined": list(self.joined)}, sort_keys=True)

    @classmethod
    def of(cls, text: str) -> Decision:
        doc = json.loads(text)
        return cls(attempt=int(doc["attempt"]), hosts=tuple(doc["hosts"]), spares=tuple(doc.get("spares", ())),
                   taken=tuple(doc.get("taken", ())), lost=dict(doc.get("lost", {})),
                   spares_gone=tuple(doc.get("spares_gone", ())), ended=doc.get("ended"), by=doc.get("by", ""),
                   joined=tuple(doc.get("joined", ())), joined_at=doc.get("joined_at"))


@dataclass(frozen=True)
class Joining:
    """Hosts taken in at an attempt's next checkpoint (``names``, in order), asked at ``at`` (time.time())."""

    names: tuple[str, ...]
    at: float

    def document(self) -> str:
        return json.dumps({"names": list(self.names), "at": self.at})

    @classmethod
    def of(cls, text: str) -> Joining:
        doc = json.loads(text)
        return cls(tuple(doc["names"]), float(doc["at"]))


def decide(membership: Membership, attempt: int, came: list[str], why_lost: dict[str, str], alive: set[str],
           by: str, joining: Joining | None = None) -> Decision:
    """The decision for the attempt after ``attempt`` of ``membership``'s hosts, where ``came`` ended it and are alive,
    the others are lost (``why_lost``), ``alive`` says which spares and hosts coming back are up, and ``joining``
    names those taken in at the checkpoint the attempt stopped at: the one model of rounds'
    (:meth:`Membership.after_loss`, then the hosts joining after the others, as :meth:`Membership.after_return`
    puts them), with the spares that are not up passed over."""
    names = membership.names
    lost = {names.index(h): why for h, why in why_lost.items()}
    gone = tuple(s for s in _labels(membership.spares) if s not in alive) if lost else ()
    chosen = membership.without_spares(gone).after_loss(lost)
    if isinstance(chosen, CannotGoOn):
        return Decision(attempt=attempt + 1, hosts=(), lost=why_lost, spares_gone=gone, ended=chosen.why, by=by)
    after = chosen.membership
    joined = tuple(n for n in (joining.names if joining else ()) if n in alive and n not in after.names)
    return Decision(attempt=attempt + 1, hosts=(*after.names, *joined),
                    spares=tuple(s for s in _labels(after.spares) if s not in joined), taken=_labels(chosen.taken),
                    lost=why_lost, spares_gone=gone, by=by, joined=joined,
                    joined_at=joining.at if joined and joining else None)


def _labels(hosts: tuple[HostConfig, ...]) -> tuple[str, ...]:
    return tuple(host_key(h) for h in hosts)


def came_or_lost(hosts: tuple[str, ...], ended: dict[str, dict[str, Any]], alive: set[str], attempt: int,
                 ttl_s: int, come_s: float) -> tuple[list[str], dict[str, str]]:
    """Of ``hosts`` (of ``attempt``), those that came (ended it, ``failed`` or ``joining``: what each said is
    ``ended``, and are ``alive``), in order, and each of the others with why it is lost: it left, it was left out,
    its lease expired, or it did not end the attempt within ``come_s``."""
    came, why_lost = [], {}
    for h in hosts:
        how = ended.get(h, {}).get("how")
        if how == "leaving":
            why_lost[h] = f"it left: {ended[h].get('why') or 'SIGTERM to its run'}"
        elif how == "left out":
            why_lost[h] = f"left out: {ended[h].get('why')}"
        elif h not in alive:
            why_lost[h] = (f"its lease in the job's etcd expired ({ttl_s} s without a keepalive): its `run`, "
                           f"its machine or its network is gone")
        elif how is None:
            why_lost[h] = f"it did not end attempt {attempt + 1} within {come_s:g} s of this host"
        else:
            came.append(h)
    return came, why_lost


class Decider:
    """This host's part in the job's decisions: its member key and lease, its word that an attempt ended, the
    decision it follows. ``label``: this host's; ``role``: ``host``, ``spare`` or ``returning`` (a host of the job
    whose `run` was started again: :meth:`has_begun`); ``every_s``: the keepalive interval; ``arrives``: this host,
    where the spec does not list it (its member key carries it, so that the others can take it in)."""

    def __init__(self, etcd: Etcd, run_id: str, label: str, role: str, every_s: float,
                 arrives: HostConfig | None = None) -> None:
        self.etcd, self.run_id, self.label, self.role, self.every_s = etcd, run_id, label, role, every_s
        self.arrives = arrives
        self.ttl_s = max(2, round(silent_after_s(every_s)))  # the lease outlives the last keepalive by as long
        self.lease: int | None = None
        self.keys: Keys | None = None
        self.reached = time.monotonic()  # when etcd last answered this host
        self.kept_until = 0.0  # before then the lease cannot have expired (its last keepalive was sent ttl_s before)
        self.out: str | None = None  # why this host is out of the job (its lease gone, or etcd silent), while it is
        self._stop = threading.Event()
        self._beating: threading.Thread | None = None

    # -- joining and leaving ------------------------------------------------------------------------------------------
    def join(self) -> Keys:
        """This host's member key, with a lease of its own, in the launch that runs (or a new one: the module
        docstring)."""
        asked = time.monotonic()
        self.lease = self.etcd.grant(self.ttl_s)
        self.kept_until = asked + self.ttl_s
        me = self._member_value()
        while True:
            launch = self._running_launch()
            keys = Keys(self.run_id, launch)
            created, _ = self.etcd.create(f"{keys.run}launch/{launch}", self.label,  # the launch and its first host
                                          also=[(keys.member(self.label), me, self.lease)])
            if created or self._live(keys):
                if not created:
                    self._claim(keys.member(self.label), me)
                self.keys = keys
                self._keep_alive()
                return keys

    def _claim(self, key: str, value: str) -> None:
        """This host's member key, put only where none is there: a key of an earlier `run` of this host (killed, its
        machine gone) goes within its lease's time, and is waited for; one kept alive that long is a `run` of this
        host in the job now, and a second is refused (AlreadyRunning), never let take its place."""
        deadline = time.monotonic() + self.ttl_s + self.back_within_s + self.every_s
        while True:
            made, _ = self.etcd.create(key, value, self.lease)
            if made:
                return
            if time.monotonic() > deadline:
                raise AlreadyRunning(f"a `run` of host {self.label} is in this job already (its key in the job's etcd "
                                     f"was kept alive for {self.ttl_s + self.back_within_s:g} s): a second `run` of "
                                     f"one host is refused")
            time.sleep(min(self.every_s, LOOK_S * 4))
            assert self.lease is not None
            self.etcd.keepalive(self.lease)  # (its own lease, while it waits: the keepalives start once it joined)

    def _member_value(self, lease: int | None = None) -> str:
        """What this host's member key holds, as joined and as put back: its role, and its lease (``lease``, else
        the one it holds: the decision that takes a host back in makes its key a host's, with the host's lease)."""
        value: dict[str, Any] = {"role": self.role, "lease": str(self.lease if lease is None else lease)}
        if self.arrives is not None:
            value["host"] = {"name": self.arrives.name, "addr": self.arrives.addr, "devices": self.arrives.devices}
        return json.dumps(value)

    def become(self, role: str) -> None:
        """This host's member key says ``role`` from now on (a host coming back, or a spare, taken in: a host)."""
        assert self.keys is not None and self.lease is not None
        self.role = role
        self.etcd.put(self.keys.member(self.label), self._member_value(), self.lease)

    def come_back(self) -> None:
        """This host, left out by the others while its `run` lived on (its link down, its machine paused), stands by
        to be taken back: its old lease revoked where it is not gone yet, its member key put again, only where none
        is there, with a lease of its own, as ``returning``, and kept alive as from :meth:`join`. Raises EtcdError
        (etcd out of reach) or AlreadyRunning."""
        assert self.keys is not None
        self.leave()  # (its lease expired, the usual case: nothing to revoke)
        self._stop, self._beating, self.role = threading.Event(), None, "returning"
        asked = time.monotonic()
        self.lease = self.etcd.grant(self.ttl_s)
        self.kept_until, self.reached, self.out = asked + self.ttl_s, time.monotonic(), None
        self._claim(self.keys.member(self.label), self._member_value())
        self._keep_alive()

    def _keep_alive(self) -> None:
        self._beating = threading.Thread(target=self._beat, name="runner-etcd-keepalive", daemon=True)
        self._beating.start()

    def has_begun(self) -> bool:
        """This host's ranks began an attempt of the launch it joined: it was in the job, was lost, and its `run` is
        started again (a host starting late at the job's start finds no such key: no attempt begins without it)."""
        assert self.keys is not None
        if any(k.endswith(f"/{self.label}") for k in self.etcd.prefix(self.keys.began())):
            return True
        made = self.decisions()  # (or the hosts went on without it before its ranks could say they began)
        return bool(made) and self.label not in made[-1].hosts

    def say_began(self, attempt: int) -> None:
        assert self.keys is not None
        self.etcd.put(self.keys.began(attempt, self.label), "")

    def _running_launch(self) -> int:
        """The newest launch of the run id if it runs (not over, a host alive in it), else the one after."""
        prefix = f"/runner/{self.run_id}/launch/"
        found = [int(k[len(prefix):]) for k in self.etcd.prefix(prefix) if k[len(prefix):].isdigit()]
        if not found:
            return 0
        newest = max(found)
        return newest if self._live(Keys(self.run_id, newest)) else newest + 1

    def _live(self, keys: Keys) -> bool:
        return self.etcd.get(keys.over) is None and bool(self.etcd.prefix(keys.member()))

    def leave(self) -> None:
        """This host's member key goes now (its lease revoked, its keepalives stopped); nothing where etcd cannot be
        reached."""
        self._stop.set()
        if self._beating is not None:
            self._beating.join()
        if self.lease is not None:
            try:
                self.etcd.revoke(self.lease)
            except EtcdError:
                pass

    # -- from joining to leaving --------------------------------------------------------------------------------------
    def _beat(self) -> None:
        """This host's lease kept alive every ``every_s`` from :meth:`join` to :meth:`leave` (while a share runs, and
        while it waits for a decision). While etcd has not answered for the lease's time this host is out
        (:attr:`out`: it cannot know whether the others went on without it, so its share ends), and it is in again
        where etcd answers and its lease lived on (an election under load, say): what is decided there says whether
        it takes part in the next attempt. An expired lease is final."""
        while not self._stop.wait(self.every_s):
            why, final = self.beat()
            self.out = why
            if final:
                return

    def beat(self) -> tuple[str | None, bool]:
        """Keep this host's lease alive once: None, or why this host is out of the job; and whether that is final
        (its lease expired)."""
        assert self.lease is not None
        asked = time.monotonic()
        try:
            left = self.etcd.keepalive(self.lease)
        except EtcdError as e:
            if time.monotonic() - self.reached >= self.ttl_s:
                return f"the job's etcd has not answered this host for {self.ttl_s} s ({e})", False
            return self.out, False
        self.reached = time.monotonic()
        if left > 0:
            self.kept_until = asked + self.ttl_s  # (etcd renewed it after this keepalive was sent)
            return None, False
        try:  # a member behind the others may answer so: the lease is gone only where a majority reads its key gone
            if self.keys is not None and self.etcd.get(self.keys.member(self.label)) is not None:
                return None, False
        except EtcdError:
            return self.out, False  # (the silence rule says when too long is too long)
        if asked < self.kept_until:
            return self._back(), False
        return f"this host's lease in the job's etcd expired ({self.ttl_s} s without a keepalive)", True

    def _back(self) -> str | None:
        """This host's member key put back with a new lease, where etcd revoked the lease this host kept alive
        (etcd-io/etcd#15247: the module docstring); its peers take it as lost only where it stays gone. None, or
        why this host is out (etcd did not take the new lease: the next keepalive tries again, until the old lease
        could have expired)."""
        assert self.keys is not None
        asked = time.monotonic()
        try:
            lease = self.etcd.grant(self.ttl_s)
            self.etcd.put(self.keys.member(self.label), self._member_value(lease), lease)
        except EtcdError:
            return self.out
        self.lease, self.kept_until = lease, asked + self.ttl_s
        print("manual: etcd revoked this host's lease though it was kept alive (a member that led etcd and was "
              "paused revokes every lease when it wakes: etcd-io/etcd#15247); its key is back with a new lease",
              file=sys.stderr, flush=True)
        return None

    @property
    def members(self) -> Members:
        """The member keys of the launch this host joined, and how each host ended an attempt, as they are now."""
        assert self.keys is not None
        return Members(self.etcd, self.keys)

    def decision(self, attempt: int) -> Decision | None:
        assert self.keys is not None
        found = self.etcd.get(self.keys.attempt(attempt))
        return Decision.of(found) if found is not None else None

    def decisions(self) -> list[Decision]:
        """Every decision of this launch, by attempt."""
        assert self.keys is not None
        return sorted((Decision.of(v) for v in self.etcd.prefix(self.keys.attempt(0)[:-1]).values()),
                      key=lambda d: d.attempt)

    def is_over(self) -> dict[str, Any] | None:
        assert self.keys is not None
        found = self.etcd.get(self.keys.over)
        return json.loads(found) if found is not None else None

    # -- after an attempt ---------------------------------------------------------------------------------------------
    def say_over(self, how: str, attempt: int | None = None) -> bool:
        """The job ended on this host (done, stopped): said before its member key goes. False: a join at ``attempt``'s
        checkpoint was asked first (:meth:`say_joining`), and the job goes on."""
        assert self.keys is not None
        try:
            created, _ = self.etcd.create(self.keys.over, json.dumps({"how": how, "by": self.label}),
                                          unless=[self.keys.joining(attempt)] if attempt is not None else [])
            return created or self.etcd.get(self.keys.over) is not None
        except EtcdError:
            return True

    def say_joining(self, attempt: int, joining: Joining) -> Joining | None:
        """Ask for ``joining`` at ``attempt``'s next checkpoint, once: the join asked (this one, or one asked first),
        or None where the job is over already."""
        assert self.keys is not None
        _, text = self.etcd.create(self.keys.joining(attempt), joining.document(), unless=[self.keys.over])
        return Joining.of(text) if text is not None else None

    def joining(self, attempt: int) -> Joining | None:
        """The join asked at ``attempt``'s checkpoint, if one was."""
        assert self.keys is not None
        found = self.etcd.get(self.keys.joining(attempt))
        return Joining.of(found) if found is not None else None

    def say_ended(self, attempt: int, how: str, why: str = "") -> None:
        assert self.keys is not None
        self.etcd.put(self.keys.ended(attempt, self.label), json.dumps({"how": how, "why": why}))

    @property
    def back_within_s(self) -> float:
        """How long a peer's key may stay gone before the peer is lost (:data:`BACK_WITHIN_BEATS` intervals)."""
        return BACK_WITHIN_BEATS * self.every_s

    @property
    def lost_after_s(self) -> float:
        """How long after a host's last keepalive its peers take it as lost: its lease's time, then its key gone for
        :attr:`back_within_s` more."""
        return self.ttl_s + self.back_within_s

    def next_attempt(self, membership: Membership, attempt: int, come_s: float,
                     stopped: Callable[[], bool], how: str = "failed", why: str = "",
                     patience_s: float | None = None) -> Decision | None:
        """This host's word that it ended ``attempt`` (``how``, ``why``: :meth:`say_ended`), then the decision for
        the attempt after it (of ``membership``'s hosts): the one that exists, or, once every host ended that
        attempt, is gone or did not end it within ``come_s``, the one this host makes, where no other host made one
        first. None: ``stopped()`` said so while it waited. Raises EtcdError where etcd has not answered for
        ``patience_s`` (default: the lease's time): a host cut off that waits as long as the others take to find it
        lost and end their shares learns, where its link comes back within that, what they decided (a flap: left
        out, or in again where its lease lived on)."""
        assert self.keys is not None
        started = time.monotonic()
        said = False
        while True:
            if stopped():
                return None
            try:
                if not said:
                    self.say_ended(attempt, how, why)
                    said = True
                found = self.decision(attempt + 1)
                if found is not None:
                    return found
                made = self._decide(membership, attempt, waited_s=time.monotonic() - started, come_s=come_s)
                if made is not None:
                    _, text = self.etcd.create(self.keys.attempt(attempt + 1), made.document(),
                                               also=self.members.as_hosts(made.joined))
                    assert text is not None
                    return Decision.of(text)
                self.reached = time.monotonic()
            except EtcdError:
                waited_for = self.ttl_s if patience_s is None else patience_s
                if time.monotonic() - max(self.reached, started) >= waited_for:
                    raise
            time.sleep(LOOK_S)

    def _decide(self, membership: Membership, attempt: int, waited_s: float, come_s: float) -> Decision | None:
        """This host's decision, where it may make one now; None: a host that is up has not ended the attempt yet,
        and the come window is not over."""
        roles = self.members.roles()
        alive = {label for label, role in roles.items() if role != "returning"}
        if time.monotonic() < self.kept_until:
            alive.add(self.label)  # (its key may be gone for a keepalive's time: etcd revoked its kept lease)
        ended = self.members.ended(attempt)
        if waited_s < come_s and any(h in alive and h not in ended for h in membership.names):
            return None
        came, why_lost = came_or_lost(membership.names, ended, alive, attempt, self.ttl_s, come_s)
        joining = self.joining(attempt)
        up = alive | {h for h in roles if joining is not None and h in joining.names}
        return decide(membership, attempt, came, why_lost, up, self.label, joining)

