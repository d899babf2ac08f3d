"""A small client of etcd's v3 API, as etcd serves it in JSON over HTTP (``POST /v3/kv/range`` and so on; keys and
values base64): what a job's membership needs of etcd, with no gRPC stack (etcd 3.4 and later serve this gateway).

etcd is a Raft-replicated store: a write is committed only by a majority of its members, and a read (linearizable,
the default here) answers only where a majority agrees; so two sides of a partition can never both write, and a side
without the majority cannot read either (:class:`EtcdError`). What the job uses: :meth:`Etcd.create` (a transaction
that puts a key only where it does not exist yet: the decision for an attempt exists at most once, and everybody
reads the one that does), leases (:meth:`Etcd.grant`, :meth:`Etcd.keepalive`: a key put with a lease goes when the
lease expires, which is how a host's liveness is told) and reads of a prefix.
"""

from __future__ import annotations

import base64
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

ASK_S = 2.0  # how long one request may take, per endpoint


class EtcdError(Exception):
    """No endpoint answered the request (none reachable, or none with a majority of the members behind it)."""


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _text(b64: str) -> str:
    return base64.b64decode(b64).decode()


def _put(key: str, value: str, lease: int | None) -> dict[str, Any]:
    put: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
    if lease is not None:
        put["lease"] = str(lease)
    return put


def _prefix_end(prefix: str) -> str:
    """The end of the key range of every key that starts with ``prefix`` (its last byte plus one)."""
    raw = bytearray(prefix.encode())
    raw[-1] += 1
    return base64.b64encode(bytes(raw)).decode()


class Etcd:
    """A client of the etcd members at ``endpoints`` (``host:port``, each a member's client URL; any may answer:
    the one that answered last is asked first)."""

    def __init__(self, endpoints: Sequence[str], ask_s: float = ASK_S) -> None:
        if not endpoints:
            raise ValueError("etcd: no endpoint")
        self.endpoints = list(endpoints)
        self.ask_s = ask_s
        self._lock = threading.Lock()  # (threads share a client: a host's keepalives, its watch, its decisions)

    def _call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            order = list(self.endpoints)
        problems = []
        for endpoint in order:
            request = urllib.request.Request(f"http://{endpoint}{path}", data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=self.ask_s) as answer:
                    found = json.loads(answer.read().decode().splitlines()[0] or "{}")
            except urllib.error.HTTPError as e:
                problems.append(f"{endpoint}: HTTP {e.code} {e.read()[:200].decode(errors='replace')}")
                continue
            except (OSError, ValueError) as e:
                problems.append(f"{endpoint}: {getattr(e, 'reason', e)}")
                continue
            with self._lock:  # the one that answered, first from now on
                self.endpoints.remove(endpoint)
                self.endpoints.insert(0, endpoint)
            return found
        raise EtcdError("; ".join(problems))

    # -- keys ---------------------------------------------------------------------------------------------------------
    def get(self, key: str) -> str | None:
        kvs = self._call("/v3/kv/range", {"key": _b64(key)}).get("kvs", [])
        return _text(kvs[0].get("value", "")) if kvs else None

    def prefix(self, prefix: str) -> dict[str, str]:
        """Every key that starts with ``prefix``, and its value."""
        found = self._call("/v3/kv/range", {"key": _b64(prefix), "range_end": _prefix_end(prefix)})
        return {_text(kv["key"]): _text(kv.get("value", "")) for kv in found.get("kvs", [])}

    def put(self, key: str, value: str, lease: int | None = None) -> None:
        self._call("/v3/kv/put", _put(key, value, lease))

    def create(self, key: str, value: str, lease: int | None = None,
               also: Sequence[tuple[str, str, int | None]] = (), unless: Sequence[str] = ()) -> tuple[bool, str | None]:
        """Put ``key`` only where it does not exist, nor any key of ``unless`` (one transaction: their create
        revisions are 0), and with it the keys of ``also`` (key, value, lease); whether this call created it, and the
        value ``key`` holds now (this one, the one that was there, or None: it is absent, and a key of ``unless`` is
        there)."""
        absent = [{"key": _b64(k), "result": "EQUAL", "target": "CREATE", "create_revision": "0"}
                  for k in (key, *unless)]
        done = self._call("/v3/kv/txn", {
            "compare": absent,
            "success": [{"request_put": _put(k, v, l)} for k, v, l in ((key, value, lease), *also)],
            "failure": [{"request_range": {"key": _b64(key)}}]})
        if done.get("succeeded"):
            return True, value
        kvs = done.get("responses", [{}])[0].get("response_range", {}).get("kvs", [])
        if not kvs and not unless:  # (deleted between the compare and now: cannot be, in one transaction)
            raise EtcdError(f"etcd: {key} neither created nor found")
        return False, _text(kvs[0].get("value", "")) if kvs else None

    def delete(self, key: str) -> None:
        self._call("/v3/kv/deleterange", {"key": _b64(key)})

    # -- leases -------------------------------------------------------------------------------------------------------
    def grant(self, ttl_s: int) -> int:
        """A lease of ``ttl_s`` seconds: the keys put with it go when it is not kept alive for that long."""
        return int(self._call("/v3/lease/grant", {"TTL": int(ttl_s)})["ID"])

    def keepalive(self, lease: int) -> int:
        """Keep the lease alive: its TTL again, or 0 where it has expired (its keys are gone)."""
        answer = self._call("/v3/lease/keepalive", {"ID": str(lease)})
        if "result" not in answer:  # an error of the member asked (no leader, say): not the lease's end
            raise EtcdError(f"keepalive: {answer.get('error', answer)}")
        return int(answer["result"].get("TTL", 0))

    def revoke(self, lease: int) -> None:
        """End the lease now: its keys go at once."""
        self._call("/v3/lease/revoke", {"ID": str(lease)})

    # -- members (the job's own etcd: a member whose machine comes back joins again) ----------------------------------
    def members(self) -> list[dict[str, Any]]:
        """The cluster's members as the member asked knows them (``ID``, ``name``: empty for one that never started,
        ``peerURLs``); no majority needed."""
        return list(self._call("/v3/cluster/member/list", {}).get("members", []))

    def remove_member(self, member_id: str) -> None:
        self._call("/v3/cluster/member/remove", {"ID": member_id})

    def add_member(self, peer_url: str) -> None:
        """A member of ``peer_url``, to be started with ``--initial-cluster-state existing``."""
        self._call("/v3/cluster/member/add", {"peerURLs": [peer_url]})
