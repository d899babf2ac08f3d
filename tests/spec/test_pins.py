"""runner.spec.pins: what a launch fixes for every process, applied to the one spec, which is left as it was."""

from __future__ import annotations

import pytest

from conftest import TARGET, compose, validate
from runner.spec.pins import Pins, pinned

pytestmark = pytest.mark.unit


def test_pins_give_a_new_spec_with_the_run_id_port_and_code() -> None:
    spec = compose(f"recipe.target={TARGET}", "run_id=typed", "init.master_port=0")
    got = Pins("R1", master_port=29400, code_dir="/runs/R1/code").apply(spec)
    assert (got.run_id, got.init.master_port, got.code_dir) == ("R1", 29400, "/runs/R1/code")
    assert (spec.run_id, spec.init.master_port, spec.code_dir) == ("typed", 0, None)  # left as it was
    kept = Pins("R2").apply(compose(f"recipe.target={TARGET}", "init.master_port=1234"))
    assert (kept.run_id, kept.init.master_port, kept.code_dir) == ("R2", 1234, None)  # None: the spec's


def test_a_script_is_pinned_to_its_copy_and_only_a_script() -> None:
    spec = compose("recipe=script", "recipe.path=train.py", "recipe.args=[--lr, '0.1']")
    got = Pins("R1", code_dir="/runs/R1/code", script_path="/runs/R1/code/train.py").apply(spec)
    assert (got.recipe.path, got.recipe.args) == ("/runs/R1/code/train.py", ["--lr", "0.1"])
    with pytest.raises(TypeError, match="a script path is pinned, but the recipe is not recipe=script"):
        Pins("R1", script_path="/x.py").apply(compose(f"recipe.target={TARGET}"))


def test_a_pinned_job_keeps_what_validation_resolved() -> None:
    job = validate((f"recipe.target={TARGET}", "topology=2x2", "launcher=slurm", "device=cpu")).job
    again = pinned(job, Pins("R1", master_port=29400))
    assert (again.hosts, again.device, again.backend, again.master_addr) == (job.hosts, job.device, job.backend,
                                                                           job.master_addr)
    assert (again.spec.run_id, again.spec.init.master_port) == ("R1", 29400)
