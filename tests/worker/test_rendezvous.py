"""runner.worker.rendezvous: a fresh init file per run and attempt, never a stale one; the store host 0 serves."""

from __future__ import annotations

import pytest

from conftest import validate
from runner.launchers import plan as plan_for
from runner.plan.paths import RunPaths
from runner.worker.rendezvous import RendezvousError, prepare_rendezvous

pytestmark = pytest.mark.unit


def _plan(tmp_path, *overrides):
    got = validate(("device=cpu", *overrides))
    assert got.valid, got.rendered()
    paths = RunPaths(tmp_path / "run", "r1")
    paths.make()
    return plan_for(got.job, paths), paths


def test_file_init_gets_a_private_folder_and_refuses_a_stale_file(tmp_path) -> None:
    plan, paths = _plan(tmp_path, "init=file")
    rdzv = prepare_rendezvous(plan, 0, paths)
    folder = paths.rendezvous_file(None).parent
    assert rdzv.init_method == f"file://{folder}/attempt0" and not rdzv.agent_store
    assert folder.stat().st_mode & 0o777 == 0o700
    paths.rendezvous_file(None).write_text("left by an earlier run")
    with pytest.raises(RendezvousError, match="already exists .* never reused"):
        prepare_rendezvous(plan, 0, paths)
    rdzv.close()
    assert not folder.exists()


def test_host_0_serves_the_store_on_a_port_it_holds(tmp_path) -> None:
    plan, paths = _plan(tmp_path, "init=tcp")
    rdzv = prepare_rendezvous(plan, 0, paths)
    try:
        port = int(rdzv.master_port)
        assert rdzv.agent_store and rdzv.store is not None and rdzv.init_method == f"tcp://127.0.0.1:{port}"
        _, sock = rdzv.store
        assert sock.getsockname() == ("127.0.0.1", port)  # one host: loopback only
    finally:
        rdzv.close()
