"""runner.launchers.base, what every launcher shares: a request rendered as the dry run prints it, the pins of a
launch, the plan every entry makes, how a scheduler's task enters the runner, and hosts a launcher must be able to
name. Each launcher's own
rules: test_rules.py and test_<kind>_launcher.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import environment, validate
from runner.launchers import LAUNCHERS, Invocation, plan_for
from runner.launchers.base import HostCommand, LaunchRequest, named_hosts_problems
from runner.records.paths import RunPaths
from runner.plan.processes import port_for

pytestmark = pytest.mark.unit

PATHS = RunPaths(Path("/runs/R1"), "R1")


def test_a_request_renders_each_command_where_it_runs_then_its_files() -> None:
    commands = (HostCommand(host="host 0 (a)", argv=("run", "a b", "x=$HOME"), note="starts 2 process(es)", cwd="/my dir"),
                HostCommand(host="this machine", argv=None, note="forks 2 process(es)"),
                HostCommand(host="bare", argv=("echo",)))
    request = LaunchRequest(launcher="x", commands=commands, files={"job.sbatch": "#!/bin/bash\nsrun x\n\n"})
    assert request.materialize() == ("# host 0 (a): starts 2 process(es)\ncd '/my dir' && run 'a b' 'x=$HOME'\n\n"
                                     "# this machine: forks 2 process(es)\n\n# bare\necho\n\n"
                                     "# --- job.sbatch ---\n#!/bin/bash\nsrun x\n")


@pytest.mark.parametrize("kind, port", [("local", None), ("slurm", None), ("manual", port_for("R1")),
                                        ("mpi", port_for("R1"))])
def test_a_launch_pins_the_run_id_and_a_port_where_its_hosts_cannot_learn_one(kind, port) -> None:
    hosts = ("topology=custom", "topology.hosts=[{name: a, devices: 1}, {name: b, devices: 1}]") \
        if kind in ("manual", "mpi") else ("topology=1x2",)
    job = validate((f"launcher={kind}", *hosts, "device=cpu", "recipe.global_batch_size=2")).job
    pins = LAUNCHERS[kind].pins(job, PATHS)
    assert (pins.run_id, pins.master_port, pins.code_dir, pins.script_path) == ("R1", port, None, None)
    fixed = validate((f"launcher={kind}", *hosts, "device=cpu", "recipe.global_batch_size=2",
                      "init.master_port=29400")).job
    assert LAUNCHERS[kind].pins(fixed, PATHS).master_port is None  # the spec's own port stays


def test_a_schedulers_task_loads_the_pinned_spec_with_the_installed_runner() -> None:
    job = validate(("launcher=slurm", "topology=2x1", "device=cpu", "recipe.global_batch_size=2")).job
    invocation = Invocation(python="/venv/bin/python", cwd="/work")
    launcher = LAUNCHERS["slurm"](plan=plan_for(job, PATHS), paths=PATHS, invocation=invocation, environment=environment())
    assert launcher.task_argv() == ("/venv/bin/python", "-P", "-m", "runner.app.task", "/runs/R1/spec.yaml")


@pytest.mark.parametrize("kind", ["local", "manual", "mpi", "ssh"])
def test_a_host_plans_its_share_as_run_planned_the_run_where_its_environment_has_nothing_to_fill_in(kind) -> None:
    """`run`, a scheduler's task and an ssh host's `run` make the plan in one place (Launcher.plan_for); only a
    launcher that leaves the master to its scheduler fills it in on the host (Slurm: test_launcher_slurm.py)."""
    hosts = ("topology=custom", "topology.hosts=[{name: a, devices: 1}, {name: b, devices: 1}]") \
        if kind != "local" else ("topology=1x2",)
    job = validate((f"launcher={kind}", *hosts, "device=cpu", "recipe.global_batch_size=2")).job
    launcher = LAUNCHERS[kind]
    planned = launcher.plan_for(job, PATHS)
    assert planned == plan_for(job, PATHS)
    assert launcher.host_plan(job, PATHS, environment(SLURM_JOB_ID="42", SLURM_STEP_NODELIST="n[1-2]")) == planned


def test_hosts_a_launcher_reaches_by_name_must_have_one() -> None:
    grid = validate(("launcher=slurm", "topology=2x1", "device=cpu", "recipe.global_batch_size=2"))  # Slurm names them
    assert grid.valid, grid.rendered()
    (problem,) = named_hosts_problems(grid.job, "mpi")
    assert (problem.key, problem.message) == ("topology.hosts", "launcher=mpi must know every host, but host(s) [0, 1] "
                                                                "have no name or addr")
    listed = validate(("launcher=mpi", "topology=custom", "topology.hosts=[{name: a, devices: 1}, {devices: 1}]",
                       "device=cpu", "recipe.global_batch_size=2"))
    assert listed.find("topology.hosts[1].name", "launcher=mpi must know every host, but host(s) [1] have no name")
    one = validate(("launcher=mpi", "topology=1x2", "device=cpu", "recipe.global_batch_size=2"))
    assert one.valid, one.rendered()  # one host: mpirun runs it here
