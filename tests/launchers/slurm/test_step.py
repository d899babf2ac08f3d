"""runner.launchers.slurm.step: the srun step is a request made from the plan once; its lines are plain text from
it, in the batch script (background, its pid in $step) or in a step script of its own inside an allocation (exec)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import validate
from runner.launchers import plan_for
from runner.launchers.slurm.step import Hostfile, SrunStep, rounds_said, srun_step
from runner.records.paths import RunPaths

pytestmark = pytest.mark.unit

PATHS = RunPaths(Path("/runs/R1"), "R1")
TASK = ("/venv/bin/python", "-P", "-m", "runner.app.task", "/runs/R1/spec.yaml")


def _step(*overrides: str) -> SrunStep:
    checked = validate(["launcher=slurm", "device=cpu", *overrides])
    assert checked.job is not None, checked.problems
    return srun_step(plan_for(checked.job, PATHS), PATHS, "/venv/bin/python", TASK)


def test_one_task_per_node_or_one_per_process():
    per_host = _step("topology=2x4")
    assert (per_host.nodes, per_host.ntasks, per_host.tasks_per_node, per_host.cpus_per_task) == (2, 2, 1, 4)
    assert per_host.hostfile is None and per_host.holding_run is None
    per_device = _step("topology=2x4", "launcher.tasks=per_device")
    assert (per_device.ntasks, per_device.tasks_per_node, per_device.cpus_per_task) == (8, 4, None)
    assert per_device.lines() == ["exec srun --kill-on-bad-exit=1 --nodes=2 --ntasks=8 --ntasks-per-node=4 "
                                  "--distribution=block /venv/bin/python -P -m runner.app.task /runs/R1/spec.yaml"]
    assert per_device.lines(background=True)[-1] == "step=$!"


def test_uneven_hosts_are_placed_by_a_hostfile_of_their_names_or_of_slurms():
    unnamed = _step("topology=hetero_2_1", "launcher.tasks=per_device", "recipe.global_batch_size=60").hostfile
    assert unnamed == Hostfile(path=PATHS.hostfile_in_batch_script(), names=None, counts=(2, 1))
    assert "counts=(2 1)" in unnamed.lines()
    named = _step("topology=custom", "topology.hosts=[{name: a, devices: 2}, {name: b, devices: 1}]",
                  "launcher.tasks=per_device", "recipe.global_batch_size=60")
    assert named.hostfile is not None and named.hostfile.names == ("a", "a", "b")
    text = named.materialize()
    assert text.startswith("#!/bin/bash\n# Written by `run` for run R1: an srun step\nset -euo pipefail\n")
    assert 'printf "%s\\n" a a b > "$SLURM_HOSTFILE"\n' in text
    assert text.endswith("--nodes=2 --ntasks=3 --distribution=arbitrary /venv/bin/python -P -m runner.app.task "
                         "/runs/R1/spec.yaml\n")


def test_a_job_that_outlives_its_nodes_runs_the_run_that_holds_its_steps():
    elastic = _step("topology=custom", "topology.hosts=[{name: n1, devices: 2},{name: n2, devices: 2}]",
                    "topology.min_nodes=1", "launcher.max_restarts=2", "recipe.global_batch_size=8")
    assert elastic.lines()[-1] == "exec /venv/bin/python -P -m runner.app.slurm_rounds /runs/R1/spec.yaml"
    assert elastic.lines(background=True)[1:] == ["/venv/bin/python -P -m runner.app.slurm_rounds /runs/R1/spec.yaml &",
                                                  "step=$!"]  # no srun line of its own
    assert rounds_said(validate(["launcher=slurm", "device=cpu", "topology=2x2"]).job) == ()
