"""Each launcher class owns the rules of its kind of launch (runner.launchers.base): validation, the master,
the plan's rules, its tasks' place. And a launcher of one's own is a class and a line in the registry."""

from __future__ import annotations

import signal

import pytest

import runner.launchers
import runner.plan.processes
from conftest import environment, validate
from runner.launchers import LAUNCHERS, plan_for
from runner.launchers.base import HostCommand, Launcher, LaunchOutcome, LaunchRequest, TaskError
from runner.plan.processes import Deferred
from runner.records.paths import RunPaths

pytestmark = pytest.mark.unit

AB = "topology.hosts=[{name: a, devices: 2}, {name: b, devices: 1}]"


def _plan(*overrides: str, paths: RunPaths | None = None):
    got = validate(("device=cpu", "recipe.global_batch_size=6", *overrides))
    assert got.valid, got.rendered()
    return plan_for(got.job, paths)


def test_the_master_and_its_port_per_launcher(tmp_path) -> None:
    paths = RunPaths(tmp_path, "r1")
    local = _plan("topology=1x2", paths=paths)
    assert (local.master_addr, local.master_port) == ("127.0.0.1", Deferred.of("free port chosen at launch"))
    manual = _plan("topology=custom", AB, "launcher=manual", "init.dir=/tmp", paths=paths)
    assert manual.master_addr == "a" and manual.master_port == str(runner.plan.processes.port_for("r1"))
    mpi = _plan("topology=custom", AB, "launcher=mpi", paths=paths)
    assert mpi.master_addr == "a" and mpi.master_port == manual.master_port
    slurm = _plan("topology=2x2", "launcher=slurm", "recipe.global_batch_size=8", paths=paths)
    assert slurm.master_addr == Deferred.of("first host of SLURM_STEP_NODELIST")
    assert slurm.master_port == Deferred.of("port derived from SLURM_JOB_ID")
    pinned = _plan("topology=2x2", "launcher=slurm", "recipe.global_batch_size=8", "init.master_port=29400",
                   "init.master_addr=10.0.0.5", paths=paths)
    assert (pinned.master_addr, pinned.master_port) == ("10.0.0.5", "29400")  # the spec's win


def test_the_stop_signal_and_who_sets_visible_devices() -> None:
    assert _plan("launcher.stop_signal=USR2").rules.stop_signal == signal.SIGUSR2
    slurm = _plan("topology=2x2", "launcher=slurm", "recipe.global_batch_size=8", "launcher.slurm.signal=B:TERM@60")
    assert slurm.rules.stop_signal == signal.SIGTERM and not slurm.rules.sets_visible_devices
    assert _plan("topology=custom", AB, "launcher=manual", "init.dir=/tmp").rules.hosts_start_apart


def test_tasks_find_their_place_from_their_launchers_variables() -> None:
    slurm = LAUNCHERS["slurm"].task_place(environment(SLURM_JOB_ID="5", SLURM_STEP_ID="0", SLURM_PROCID="3",
                                                      SLURM_LOCALID="1", SLURM_NTASKS="4", SLURM_RESTART_COUNT="2"))
    assert (slurm.index, slurm.count, slurm.local_index, slurm.source, slurm.attempt) == (3, 4, 1, "Slurm", 2)
    mpi = LAUNCHERS["mpi"].task_place(environment(PMI_RANK="2", PMI_SIZE="3"))
    assert (mpi.index, mpi.count, mpi.source) == (2, 3, "MPICH / Intel MPI (PMI)")
    with pytest.raises(TaskError, match="not an srun task"):
        LAUNCHERS["slurm"].task_place(environment())
    with pytest.raises(TaskError, match="launcher=local starts no tasks of its own"):
        LAUNCHERS["local"].task_place(environment())


def test_an_unknown_launcher_is_refused_with_the_registered_ones() -> None:
    got = validate(("launcher.kind=kubernetes",))
    assert not got.valid
    assert got.find("launcher.kind", "'kubernetes' is not a launcher") and got.find("launcher.kind", "local, manual, mpi, slurm")


def test_restarts_only_where_the_launcher_restarts() -> None:
    got = validate(("topology=2x2", "launcher=slurm", "launcher.max_restarts=2", "recipe.global_batch_size=8"))
    assert got.find("launcher.max_restarts", "launcher=slurm does not restart a job")
    assert got.find("launcher.max_restarts", "launcher.slurm.requeue=true")
    assert validate(("launcher.max_restarts=2",)).valid


TWO_HOSTS = "topology.hosts=[{name: 10.0.0.1, devices: 1}, {name: 10.0.0.2, devices: 1}]"


@pytest.mark.parametrize("launcher", ["manual", "mpi"])
def test_hosts_started_by_hand_or_by_mpirun_restart(launcher) -> None:
    got = validate((f"launcher={launcher}", "topology=custom", TWO_HOSTS, "init=tcp", "launcher.max_restarts=2",
                    "recipe.global_batch_size=2"))
    assert got.valid, got.rendered()


def test_hosts_started_by_hand_need_a_store_to_restart_together() -> None:
    got = validate(("launcher=manual", "topology=custom", TWO_HOSTS, "init=file", "launcher.max_restarts=2",
                    "recipe.global_batch_size=2"))
    assert got.find("launcher.max_restarts", "init=file has none")
    assert got.find("launcher.max_restarts", "init=tcp or init=env")
    one = validate(("launcher=manual", "init=file", "launcher.max_restarts=2"))  # one host: no agreement needed
    assert one.valid, one.rendered()


class EchoLauncher(Launcher):
    """A launcher of one's own: it prints one line per host instead of starting anything."""

    name = "echo"

    @classmethod
    def job_problems(cls, job, probe):
        if len(job.hosts) > 2:
            from runner.spec.problems import Problem
            yield Problem("topology", f"echo takes 2 hosts at most, not {len(job.hosts)}", "topology=1x2")

    def request(self) -> LaunchRequest:
        commands = tuple(HostCommand(host=h.label, argv=("echo", h.label, str(len(self.plan.host_records(h.index)))))
                         for h in self.plan.job.hosts)
        return LaunchRequest(launcher=self.name, commands=commands)

    def launch(self, request) -> LaunchOutcome:
        return LaunchOutcome(code=0)


def test_a_launcher_of_ones_own_is_a_class_and_a_registry_line(monkeypatch, tmp_path) -> None:
    monkeypatch.setitem(LAUNCHERS, "echo", EchoLauncher)
    got = validate(("launcher.kind=echo", "topology=custom", "topology.hosts=[{name: a, devices: 2}, {name: b, devices: 2}]",
                    "recipe.global_batch_size=8"))
    assert got.valid, got.rendered()
    paths = RunPaths(tmp_path, "r9")
    plan = plan_for(got.job, paths)
    assert plan.master_addr == "a" and plan.world_size == 4  # the base class's rules: host 0, a free port
    assert plan.master_port == Deferred.of("free port chosen at launch")
    request = EchoLauncher(plan=plan, paths=paths, invocation=runner.launchers.Invocation(python="python", cwd="/x"),
                           environment=environment()).request()
    assert request.materialize() == "# a\necho a 2\n\n# b\necho b 2\n"
    refused = validate(("launcher.kind=echo", "topology=3x1", "recipe.global_batch_size=3"))
    assert refused.find("topology", "echo takes 2 hosts at most, not 3")
