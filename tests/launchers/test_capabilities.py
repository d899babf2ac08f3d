"""runner.launchers.capabilities: each launcher declares what its kind of launch can do once, as one frozen record,
and validation, the plan's rules and `run` read it there."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import validate
from runner.launchers import LAUNCHERS, plan_for
from runner.launchers.base import Launcher, LaunchOutcome, LaunchRequest
from runner.launchers.capabilities import RESTART_HINT, Capabilities

pytestmark = pytest.mark.unit


def test_every_launcher_declares_one_record_and_the_base_the_plainest_launch() -> None:
    assert Launcher.capabilities == Capabilities()
    assert all(isinstance(kind.capabilities, Capabilities) for kind in LAUNCHERS.values())
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(LAUNCHERS["local"].capabilities, "forks_here", False)


def test_who_can_what() -> None:
    def which(flag: str) -> set[str]:
        return {name for name, kind in LAUNCHERS.items() if getattr(kind.capabilities, flag)}

    assert which("supports_restarts") == {"local", "manual", "mpi", "ssh"}
    assert which("survives_lost_hosts") == {"manual", "slurm", "ssh"}
    assert which("forks_here") == {"local", "manual"}
    assert which("pins_master_port") == {"manual", "mpi", "ssh"}
    assert which("gives_mpi_ranks") == which("tasks_end_together") == {"mpi"}
    assert which("hosts_start_apart") == {"manual"}
    assert {name for name, kind in LAUNCHERS.items() if not kind.capabilities.shares_run_folder} == {"manual", "ssh"}
    assert {name for name, kind in LAUNCHERS.items() if not kind.capabilities.sets_visible_devices} == {"slurm"}


class _Once(Launcher):
    """A launcher of one's own that says it does not restart, and what to do instead."""

    name = "once"
    capabilities = Capabilities(restart_hint="run it again by hand", master_source="the first host it likes")

    def request(self) -> LaunchRequest:
        return LaunchRequest(launcher=self.name, commands=())

    def launch(self, request: LaunchRequest) -> LaunchOutcome:
        return LaunchOutcome(code=0)


def test_validation_and_the_plan_read_a_launchers_record(monkeypatch) -> None:
    monkeypatch.setitem(LAUNCHERS, "once", _Once)
    got = validate(("launcher.kind=once", "launcher.max_restarts=1"))
    assert got.find("launcher.max_restarts", "launcher=once does not restart a job")
    assert got.find("launcher.max_restarts", "run it again by hand")
    assert Capabilities().restart_hint == RESTART_HINT
    job = validate(("launcher.kind=once",)).job
    rules = _Once.launch_rules(job, None)
    assert (rules.master_source, rules.sets_visible_devices, rules.hosts_start_apart) == \
        ("the first host it likes", True, False)
    assert plan_for(job).rules == rules  # the plan every entry makes, by the launcher the job names
