"""runner.launchers.elastic.etcd against a real etcd (tests/etcd_fixtures.py): a key created at most once, a prefix
read, a lease that expires when nobody keeps it alive, and no endpoint that answers said as EtcdError."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from etcd_fixtures import free_ports, local_etcd
from runner.launchers.elastic.etcd import Etcd, EtcdError
from runs import wait_until


@pytest.fixture(scope="module")
def etcd() -> Iterator[Etcd]:
    with local_etcd() as endpoint:
        yield Etcd([endpoint])


def test_a_key_is_created_once_whoever_races_for_it(etcd) -> None:
    """Eight threads create one key with eight values: one created it, and every one reads the same value."""
    got: list[tuple[bool, str]] = []
    threads = [threading.Thread(target=lambda v=v: got.append(etcd.create("/t/once", f"v{v}"))) for v in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(created for created, _ in got) == 1 and len({value for _, value in got}) == 1
    assert etcd.get("/t/once") == got[0][1]


def test_a_prefix_is_every_key_under_it_and_only_those(etcd) -> None:
    for key in ("/p/a", "/p/b", "/pq", "/o"):
        etcd.put(key, key.upper())
    assert etcd.prefix("/p/") == {"/p/a": "/P/A", "/p/b": "/P/B"}
    etcd.delete("/p/a")
    assert etcd.prefix("/p/") == {"/p/b": "/P/B"} and etcd.get("/p/a") is None


def test_a_key_goes_with_its_lease_and_a_created_key_may_bring_others(etcd) -> None:
    lease = etcd.grant(1)
    created, _ = etcd.create("/l/launch", "x", also=[("/l/member", "y", lease)])
    assert created and etcd.get("/l/member") == "y" and etcd.keepalive(lease) > 0
    wait_until(lambda: etcd.get("/l/member") is None, 10, "the key gone with its lease")  # nobody keeps it alive
    assert etcd.keepalive(lease) == 0 and etcd.get("/l/launch") == "x"
    other = etcd.grant(30)
    etcd.put("/l/revoked", "z", other)
    etcd.revoke(other)
    assert etcd.get("/l/revoked") is None


def test_no_endpoint_that_answers_is_an_error_naming_each() -> None:
    (port,) = free_ports("127.0.0.1", 1)
    with pytest.raises(EtcdError, match=f"127.0.0.1:{port}: .*refused"):
        Etcd([f"127.0.0.1:{port}"], ask_s=0.5).get("/x")


def test_an_endpoint_that_answers_is_found_after_one_that_does_not(etcd) -> None:
    (port,) = free_ports("127.0.0.1", 1)
    both = Etcd([f"127.0.0.1:{port}", *etcd.endpoints], ask_s=0.5)
    both.put("/f/k", "v")
    assert both.get("/f/k") == "v" and both.endpoints[0] == etcd.endpoints[0]  # the one that answered, first now
