"""The keys of one launch of a launcher=manual job in etcd (:class:`Keys`; what each holds: the module docstring of
runner.launchers.elastic.decisions), and the member keys read as they are now (:class:`Members`): who is alive, who
stands by to be taken in, which hosts arrived that the spec does not list."""

from __future__ import annotations

import json
from typing import Any

from runner.launchers.elastic.etcd import Etcd
from runner.spec.schema import HostConfig

LEFT = ("leaving", "left out")  # how a host that leaves the job ends an attempt: the others go on without it


class Keys:
    """The keys of one launch of run ``run_id``."""

    def __init__(self, run_id: str, launch: int) -> None:
        self.run = f"/runner/{run_id}/"
        self.launch = launch
        self.root = f"{self.run}launch/{launch}/"

    def member(self, label: str = "") -> str:
        return f"{self.root}member/{label}"

    def ended(self, attempt: int, label: str = "") -> str:
        return f"{self.root}ended/{attempt}/{label}"

    def attempt(self, attempt: int) -> str:
        return f"{self.root}attempt/{attempt}"

    def began(self, attempt: int | None = None, label: str = "") -> str:
        return f"{self.root}began/" if attempt is None else f"{self.root}began/{attempt}/{label}"

    def joining(self, attempt: int) -> str:
        return f"{self.root}joining/{attempt}"

    @property
    def over(self) -> str:
        return f"{self.root}over"


class Members:
    """The member keys of one launch (``member/<host>``: its role and lease, and, for a host that arrived, its name,
    address and devices) and what each host said of how it ended an attempt (``ended/<k>/<host>``), read from etcd at
    each call."""

    def __init__(self, etcd: Etcd, keys: Keys) -> None:
        self.etcd, self.keys = etcd, keys

    def alive(self) -> set[str]:
        """The hosts and spares whose member key is there (hosts coming back are not among them until taken in:
        :meth:`returning`)."""
        return {label for label, role in self.roles().items() if role != "returning"}

    def returning(self) -> set[str]:
        """The hosts coming back (their `run` started again) whose member key is there."""
        return {label for label, role in self.roles().items() if role == "returning"}

    def standing_by(self) -> set[str]:
        """Those whose `run` waits to be taken in: hosts coming back, and spares (not a host left out whose `run`
        is still ending: its key says ``host`` until it goes)."""
        return {label for label, role in self.roles().items() if role in ("returning", "spare")}

    def arrivals(self) -> dict[str, HostConfig]:
        """The hosts that arrived (the spec does not list them: launcher.manual.host=<name>) whose member key is
        there, each as its key says it is."""
        found = {}
        for label, doc in self.documents().items():
            host = doc.get("host")
            if isinstance(host, dict) and host.get("name") == label:
                found[label] = HostConfig(name=label, addr=host.get("addr"), devices=host.get("devices"))
        return found

    def roles(self) -> dict[str, str]:
        """Each member key's label and role."""
        return {label: str(doc.get("role", "host")) for label, doc in self.documents().items()}

    def documents(self) -> dict[str, dict[str, Any]]:
        prefix = self.keys.member()
        return {k[len(prefix):]: _document(v) for k, v in self.etcd.prefix(prefix).items()}

    def as_hosts(self, names: tuple[str, ...]) -> list[tuple[str, str, int | None]]:
        """The member keys of ``names`` (hosts back, spares: taken in by the decision written with these) as hosts',
        each with its own lease: the other hosts watch them as hosts from the first look at the next attempt (a
        lease that ended meanwhile fails the decision's transaction: it is made again without that host)."""
        docs = self.documents()
        return [(self.keys.member(n), json.dumps({**docs[n], "role": "host"}), int(docs[n]["lease"]))
                for n in names if str(docs.get(n, {}).get("lease", "")).isdigit()]

    def leaving(self, attempt: int) -> set[str]:
        """The hosts that left during ``attempt`` (SIGTERM to their `run`: a preempted machine; or named before it
        by the data-network check, or as the host that hung the two attempts before: ``left out``)."""
        return set(self.leavers(attempt))

    def leavers(self, attempt: int) -> dict[str, tuple[str, str]]:
        """Those of :meth:`leaving`, each with how (``leaving``, ``left out``) and why."""
        return {label: (doc["how"], str(doc.get("why", ""))) for label, doc in self.ended(attempt).items()
                if doc.get("how") in LEFT}

    def ended(self, attempt: int) -> dict[str, dict[str, Any]]:
        """What each host that ended ``attempt`` said of it (runner.launchers.elastic.decisions.Decider.say_ended)."""
        prefix = self.keys.ended(attempt)
        found = {k[len(prefix):]: json.loads(v) for k, v in self.etcd.prefix(prefix).items()}
        return {label: doc for label, doc in found.items() if isinstance(doc, dict)}


def _document(value: str) -> dict[str, Any]:
    """What a member key holds (its ``role``: ``host``, ``spare``, ``returning``; its ``lease``)."""
    try:
        found = json.loads(value)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}
