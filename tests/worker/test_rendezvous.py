"""runner.worker.rendezvous: a fresh init file per run and attempt, never a stale one; the store host 0 serves."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from conftest import validate
from runner.launchers import plan_for
from runner.records.paths import RunPaths
from runner.worker.rendezvous import RendezvousError, prepare_rendezvous



def _plan(tmp_path, *overrides):
    got = validate(("device=cpu", *overrides))
    assert got.valid, got.rendered()
    paths = RunPaths(tmp_path / "run", "r1")
    paths.make()
    return plan_for(got.job, paths), paths


@pytest.mark.unit
def test_file_init_gets_a_private_folder_and_refuses_a_stale_file(tmp_path) -> None:
    # (no store to serve: no zygote is asked)
    plan, paths = _plan(tmp_path, "init=file")
    rdzv = prepare_rendezvous(plan, 0, paths, None)
    folder = paths.rendezvous_file(None).parent
    assert rdzv.init_method == f"file://{folder}/attempt0" and not rdzv.agent_store
    assert folder.stat().st_mode & 0o777 == 0o700
    paths.rendezvous_file(None).write_text("left by an earlier run")
    with pytest.raises(RendezvousError, match="already exists .* never reused"):
        prepare_rendezvous(plan, 0, paths, None)
    rdzv.close()
    assert not folder.exists()


def _listening(port: int) -> list[str]:
    """The local addresses this machine listens on at ``port`` (from /proc/net/tcp: state 0A is LISTEN)."""
    found = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:
            found.append(".".join(str(b) for b in reversed(bytes.fromhex(addr))))
    return found


def _reachable(port: int) -> bool:
    import torch.distributed as dist

    client = dist.TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=5), wait_for_workers=False)
    client.set("k", "v")
    return client.get("k") == b"v"


def test_host_0_serves_the_store_on_a_port_it_holds(tmp_path, zygote) -> None:
    plan, paths = _plan(tmp_path, "init=tcp")
    rdzv = prepare_rendezvous(plan, 0, paths, zygote)
    try:
        port = int(rdzv.master_port)
        assert rdzv.agent_store and rdzv.server is not None and rdzv.init_method == f"tcp://127.0.0.1:{port}"
        assert _listening(port) == ["127.0.0.1"]  # one host: loopback only
        assert _reachable(port)
    finally:
        rdzv.close()


def test_an_earlier_attempts_store_going_away_leaves_the_next_one_listening(tmp_path, zygote) -> None:
    """Each attempt's store process owns its listening socket: the first one stopped after the second opened
    must not take the second one's with it."""
    plan, paths = _plan(tmp_path, "init=tcp")
    first = prepare_rendezvous(plan, 0, paths, zygote)
    second = prepare_rendezvous(plan, 0, paths, zygote)
    try:
        first.close()
        port = int(second.master_port)
        assert _listening(port) == ["127.0.0.1"] and _reachable(port)
    finally:
        second.close()
