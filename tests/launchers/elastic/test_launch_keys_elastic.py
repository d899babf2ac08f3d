"""runner.launchers.elastic.launch_keys: where one launch's keys lie, and its member and ``ended`` keys read as the
decisions and the joins read them (alive, coming back, standing by, arrived, left), from a dictionary that answers
as etcd's prefix reads do (the same reads against a real etcd: tests/launchers/elastic/test_decisions_elastic.py)."""

from __future__ import annotations

import json

import pytest

from runner.launchers.elastic.launch_keys import Keys, Members
from runner.spec.schema import HostConfig

pytestmark = pytest.mark.unit


class Store:
    """Keys and values, read by prefix as runner.launchers.elastic.etcd.Etcd reads them."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def prefix(self, prefix: str) -> dict[str, str]:
        return {k: v for k, v in self.values.items() if k.startswith(prefix)}


def test_every_key_of_a_launch_is_under_the_run_and_its_launch_number() -> None:
    keys = Keys("r1", 3)
    assert keys.member("a") == "/runner/r1/launch/3/member/a"
    assert (keys.ended(2, "b"), keys.attempt(4), keys.joining(1), keys.over) == (
        "/runner/r1/launch/3/ended/2/b", "/runner/r1/launch/3/attempt/4", "/runner/r1/launch/3/joining/1",
        "/runner/r1/launch/3/over")
    assert keys.began() == "/runner/r1/launch/3/began/" and keys.began(0, "a") == "/runner/r1/launch/3/began/0/a"


def test_members_are_read_by_role_and_an_arrived_host_as_its_key_says() -> None:
    keys = Keys("r1", 0)
    arrived = {"role": "spare", "lease": "9", "host": {"name": "x", "addr": "10.0.0.9", "devices": 2}}
    members = Members(Store({keys.member("a"): json.dumps({"role": "host", "lease": "7"}),  # type: ignore[arg-type]
                             keys.member("b"): json.dumps({"role": "returning", "lease": "8"}),
                             keys.member("s"): json.dumps({"role": "spare", "lease": "not a lease"}),
                             keys.member("x"): json.dumps(arrived),
                             keys.member("y"): "not json",  # (read as a host's: a key whose role cannot be read)
                             Keys("r1", 1).member("z"): json.dumps({"role": "host"})}), keys)  # another launch's
    assert members.alive() == {"a", "s", "x", "y"} and members.returning() == {"b"}
    assert members.standing_by() == {"b", "s", "x"}
    assert members.arrivals() == {"x": HostConfig(name="x", addr="10.0.0.9", devices=2)}
    assert members.as_hosts(("b", "s", "x")) == [  # (s's lease cannot be read: its key is not taken over)
        (keys.member("b"), json.dumps({"role": "host", "lease": "8"}), 8),
        (keys.member("x"), json.dumps({**arrived, "role": "host"}), 9)]


def test_the_hosts_that_left_an_attempt_and_how() -> None:
    keys = Keys("r1", 0)
    members = Members(Store({keys.ended(1, "a"): json.dumps({"how": "failed", "why": ""}),  # type: ignore[arg-type]
                             keys.ended(1, "b"): json.dumps({"how": "leaving", "why": "SIGTERM to its `run`"}),
                             keys.ended(1, "c"): json.dumps({"how": "left out", "why": "the data-network check"}),
                             keys.ended(1, "d"): json.dumps(["not", "a", "record"]),
                             keys.ended(2, "e"): json.dumps({"how": "leaving"})}), keys)
    assert members.leavers(1) == {"b": ("leaving", "SIGTERM to its `run`"), "c": ("left out", "the data-network check")}
    assert members.leaving(1) == {"b", "c"} and set(members.ended(1)) == {"a", "b", "c"}
