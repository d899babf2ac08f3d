"""runner.launchers.mpi, without processes: its rules, the mpirun line it builds (request), where a task finds its
place, and a launch without mpirun. The lines as text are golden files (test_golden_commands.py); mpirun across the
namespace hosts for real is in test_multihost.py."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from conftest import environment, hosts_override, make_spec, validate
from runner.common import exits
from runner.launchers import LAUNCHERS, Invocation, plan_for
from runner.launchers import mpi
from runner.launchers.base import LaunchOutcome, TaskError
from runner.launchers.mpi import ATTEMPT, MpiLauncher
from runner.records.paths import RunPaths
from runner.plan.processes import Deferred, port_for
from runner.spec.pins import pinned
from runner.spec.schema import TaskMode

pytestmark = pytest.mark.unit

PATHS = RunPaths(Path("/runs/R1"), "R1")
AB = hosts_override({"name": "a", "devices": 2}, {"name": "b", "devices": 1})
TASK = ("/venv/bin/python", "-P", "-m", "runner.app.task", "/runs/R1/spec.yaml")


def launcher(*overrides: str) -> MpiLauncher:
    """launcher=mpi on ``overrides``, pinned and planned as the launch does it."""
    got = validate(("launcher=mpi", "device=cpu", "recipe.global_batch_size=6", *overrides))
    assert got.valid, got.rendered()
    job = pinned(got.job, MpiLauncher.pins(got.job, PATHS))
    return MpiLauncher(plan=plan_for(job, PATHS), paths=PATHS, invocation=Invocation(python="/venv/bin/python", cwd="/work/proj"), environment=environment())


def argv(*overrides: str) -> tuple[str, ...]:
    (command,) = launcher(*overrides).request().commands
    assert command.host == "this machine" and command.cwd == "/work/proj"
    return command.argv


def test_one_rank_per_process_in_the_plans_blocks() -> None:
    assert argv(*AB) == ("mpirun", "-np", "3", "-H", "a:2,b:1", "--map-by", "slot", "--bind-to", "none", *TASK)
    assert launcher(*AB).request().commands[0].note == "one MPI rank per process"


def test_one_task_per_host_that_forks_its_processes() -> None:
    assert argv(*AB, "launcher.tasks=per_host")[:5] == ("mpirun", "-np", "2", "-H", "a:1,b:1")
    assert launcher(*AB, "launcher.tasks=per_host").request().commands[0].note == \
        "one task per host, each forks its processes"
    assert argv("topology=1x4", "recipe.global_batch_size=4")[1:5] == ("-np", "4", "-H", "localhost:4")  # unnamed


def test_options_exports_and_restarts() -> None:
    line = argv(*AB, "launcher.mpi.mpirun=/opt/ompi/bin/mpirun", "launcher.mpi.allow_run_as_root=true",
                "launcher.mpi.oversubscribe=true", "launcher.mpi.export=[HF_HOME,WANDB_API_KEY]",
                "launcher.max_restarts=2", "init=tcp", "launcher.grace_s=2.5", "launcher.mpi.extra=[--tag-output]")
    assert line == ("/opt/ompi/bin/mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "3", "-H", "a:2,b:1",
                    "--map-by", "slot", "--bind-to", "none", "-x", "HF_HOME", "-x", "WANDB_API_KEY", "-x", ATTEMPT, "--tag-output", *TASK)


def test_an_export_that_is_no_variable_name_is_refused() -> None:
    got = validate(("launcher=mpi", *AB, "launcher.mpi.export=[HF_HOME,'A-B']", "recipe.global_batch_size=6"))
    assert got.find("launcher.mpi.export[1]", "'A-B' is not a variable name")
    assert not got.find("launcher.mpi.export[0]")


def test_mpi_refuses_ipv6_literals() -> None:
    """mpirun -H host:slots cannot take an IPv6 literal: refused with a reason, not an ambiguous command."""
    spec = make_spec(devices=[1, 1], names=["a", "b"], addrs=["fd00::1", "fd00::2"], launcher="mpi",
                     tasks=TaskMode.per_device)
    assert validate(spec).find("topology.hosts[0].addr", "mpirun -H cannot take IPv6 literals")


def test_the_hosts_agree_on_the_port_of_the_run() -> None:
    job = launcher(*AB).plan.job
    assert job.spec.init.master_port == port_for("R1")
    assert MpiLauncher.master_port(job, PATHS) == str(port_for("R1"))
    assert MpiLauncher.master_port(job, None) == Deferred.of("port derived from the run id")


def test_a_task_finds_its_place_and_attempt_from_mpiruns_variables() -> None:
    place = MpiLauncher.task_place(environment(OMPI_COMM_WORLD_RANK="2", OMPI_COMM_WORLD_SIZE="3",
                                               OMPI_COMM_WORLD_LOCAL_RANK="0", OMPI_COMM_WORLD_LOCAL_SIZE="1",
                                               RUNNER_ATTEMPT="1"))
    assert (place.index, place.count, place.local_index, place.source, place.attempt) == (2, 3, 0, "Open MPI", 1)
    with pytest.raises(TaskError, match=r"launcher=mpi, but no MPI rank variables are set \(OMPI_COMM_WORLD_RANK"):
        MpiLauncher.task_place(environment())


def test_a_launch_without_mpirun_says_how_to_get_it(capsys) -> None:
    chosen = launcher(*AB, "launcher.mpi.mpirun=/nonexistent/mpirun")
    assert chosen.launch(chosen.request()) == LaunchOutcome(code=exits.INVALID)
    err = capsys.readouterr().err
    assert err.startswith("mpi: /nonexistent/mpirun -np 3 ")
    assert ("error: launcher=mpi: '/nonexistent/mpirun' is not on PATH; hint: install Open MPI, or give its path: "
            "launcher.mpi.mpirun=/path/to/mpirun") in err


class Recorder:
    """What a signal to `run` reaches: the job's channel (its stop requests) and mpirun (the signals it got)."""

    def __init__(self) -> None:
        self.stops: list[tuple[int, str]] = []
        self.sent: list[int] = []

    def request_stop(self, signum: int, host: str) -> None:
        self.stops.append((signum, host))

    def send_signal(self, signum: int) -> None:
        self.sent.append(signum)


def passing_on(monkeypatch, reachable: bool = True) -> tuple[MpiLauncher, Recorder]:
    chosen, seen = launcher(*AB), Recorder()
    monkeypatch.setattr(mpi, "channel_of", lambda *_args: seen if reachable else None)
    monkeypatch.setattr(mpi.socket, "gethostname", lambda: "login1")
    return chosen, seen


def test_a_signal_to_run_reaches_the_tasks_through_host_0s_store_and_mpirun_is_left_alone(monkeypatch) -> None:
    """Open MPI's own stop sends the tasks nothing for odls_base_sigkill_timeout, then SIGTERM, then waits as long
    again: Ctrl-C, SIGTERM and the stop signal go on the job's channel, which every task's agent reads."""
    chosen, seen = passing_on(monkeypatch)
    chosen._pass_on(signal.SIGUSR1, seen)
    assert (seen.stops, seen.sent, chosen._stop_passed_on, chosen._signalled) == ([(signal.SIGUSR1, "login1")], [],
                                                                                  True, None)
    chosen._pass_on(signal.SIGTERM, seen)
    assert (seen.stops[1:], seen.sent, chosen._signalled) == ([(signal.SIGTERM, "login1")], [], signal.SIGTERM)


def test_a_second_ctrl_c_is_mpiruns_own_stop(monkeypatch) -> None:
    chosen, seen = passing_on(monkeypatch)
    chosen._pass_on(signal.SIGINT, seen)
    chosen._pass_on(signal.SIGINT, seen)
    assert (seen.stops, seen.sent, chosen._signalled) == ([(signal.SIGINT, "login1")], [signal.SIGINT], signal.SIGINT)


def test_without_host_0s_store_the_signal_goes_to_mpirun_and_run_says_so(monkeypatch, capsys) -> None:
    chosen, seen = passing_on(monkeypatch, reachable=False)
    chosen._pass_on(signal.SIGTERM, seen)
    assert (seen.stops, seen.sent) == ([], [signal.SIGTERM])
    assert capsys.readouterr().err == ("SIGTERM: host 0's store cannot be reached from here: passed on to mpirun (its "
                                       "own stop)\n")


def test_the_tasks_end_each_attempt_together_under_mpirun_only() -> None:
    """mpirun kills every task once one ends badly: under it, and under it only, the agents end together."""
    assert launcher(*AB).plan.rules.tasks_end_together
    assert {name for name, kind in LAUNCHERS.items() if kind.capabilities.tasks_end_together} == {"mpi"}
