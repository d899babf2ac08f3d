"""runner.worker.rank_body, what the recipe's and the script's bodies share: the exit status a Python process would
have for sys.exit(...), a failure recorded in the rank's run folder and shown on its stderr, and a process group made
and destroyed heard by the agent (a real gloo group of one process, in this one)."""

from __future__ import annotations

import json

import pytest

from conftest import validate
from runner.environments.process import ProcessEnvironment
from runner.launchers import plan_for
from runner.records.paths import RunPaths
from runner.training.output import AgentChannel
from runner.worker.preparation import rank_setups
from runner.common import exits
from runner.worker.rank_body import exit_status, failed, watch_process_groups
from runner.worker.rendezvous import Rendezvous


def setup_of(tmp_path, processes: int = 1):
    got = validate((f"topology=1x{processes}", "device=cpu"))
    paths = RunPaths(tmp_path, "r1")
    paths.make()
    return rank_setups(plan_for(got.job, paths), 0, Rendezvous("env://", "29500", True), paths,
                       ProcessEnvironment.read({}))[0]


@pytest.mark.unit
def test_the_exit_status_is_pythons_for_sys_exit(capsys) -> None:
    assert exit_status(SystemExit()) == 0 and exit_status(SystemExit(3)) == 3 and exit_status(SystemExit(257)) == 1
    assert exit_status(SystemExit("bye")) == 1 and capsys.readouterr().err == "bye\n"  # printed, as Python does
    assert exits.from_signal(2) == 130  # as a shell says Ctrl-C (runner.common.exits: the one helper)


@pytest.mark.unit
def test_a_failure_is_recorded_in_the_run_folder_and_shown_on_stderr(tmp_path, capsys) -> None:
    setup = setup_of(tmp_path)
    try:
        raise ValueError("bad batch")
    except ValueError as e:
        failed(setup, e, None)
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and err.endswith("ValueError: bad batch\n")
    record = json.loads(setup.paths.rank(0).error.read_text())
    assert record["rank"] == 0 and record["exception"] == "ValueError: bad batch"


def test_the_agent_hears_a_process_group_made_and_destroyed(tmp_path, monkeypatch) -> None:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    setup = setup_of(tmp_path)
    heard = []

    class Heard(AgentChannel):
        def __init__(self) -> None:
            pass

        def life(self, what: str) -> None:
            heard.append(what)

    for module in (dist, c10d):  # restored after the test: the wrappers replace torch's functions
        monkeypatch.setattr(module, "init_process_group", dist.init_process_group)
        monkeypatch.setattr(module, "destroy_process_group", dist.destroy_process_group)
    watch_process_groups(setup, None, Heard(), own=False)
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    dist.destroy_process_group()
    assert heard == ["joined", "destroyed"]
    assert setup.paths.rank(0).joined.read_text().strip() == "gloo"
