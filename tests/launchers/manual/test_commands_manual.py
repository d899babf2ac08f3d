"""runner.launchers.manual.commands: the dry run's command for a host that arrives (where topology.max_nodes leaves
room beyond the hosts and spares listed), with the keys each host's command sets for itself dropped from what was
typed. The hosts' and spares' commands, and what the dry run says of a job that outlives its hosts, are tested through
the launcher's request in tests/launchers/manual/test_launcher_manual.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import hosts_override, validate
from runner.launchers import Invocation, plan_for
from runner.launchers.manual import ManualLauncher
from runner.launchers.manual.commands import host_commands, rounds_said
from runner.records.paths import RunPaths
from runner.spec.pins import pinned

pytestmark = pytest.mark.unit

PATHS = RunPaths(Path("/runs/R1"), "R1")
TWO = hosts_override({"name": "a", "addr": "10.0.0.1", "devices": 2}, {"name": "b", "addr": "10.0.0.2", "devices": 2})
ON_ONE = ("topology.min_nodes=1", "launcher.max_restarts=3", "launcher.manual.etcd=[10.0.0.5:2379]")


def plan(*overrides: str):
    got = validate(("launcher=manual", "device=cpu", "recipe.global_batch_size=4", *TWO, *ON_ONE, *overrides))
    assert got.valid, got.rendered()
    return plan_for(pinned(got.job, ManualLauncher.pins(got.job, PATHS)), PATHS)


def test_a_host_that_arrives_gets_a_command_where_max_nodes_leaves_room_beyond_the_listed_machines() -> None:
    typed = Invocation(python="/venv/bin/python", cwd="/work/proj",
                       overrides=("launcher.manual.host=x", "launcher.manual.addr=10.0.0.9", "recipe.epochs=3"))
    roomy = host_commands(plan("topology.max_nodes=3"), typed)
    assert [c.host for c in roomy] == ["host 0 (10.0.0.1)", "host 1 (10.0.0.2)",
                                       "a host that arrives (the spec does not list it; up to topology.max_nodes=3)"]
    arrives = roomy[-1]
    assert arrives.argv[-2:] == ("launcher.manual.host=NAME", "launcher.manual.addr=ADDRESS")
    assert "recipe.epochs=3" in arrives.argv and not [a for a in arrives.argv if a in typed.overrides[:2]]
    assert (arrives.note, arrives.cwd) == ("joins at a checkpoint", "/work/proj")
    assert len(host_commands(plan(), typed)) == 2  # max_nodes at the hosts: nobody arrives
    assert [c.argv for c in rounds_said(plan().job)] == [None, None, None]
