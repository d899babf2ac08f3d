"""The helpers of conftest.py do what they say (they are what every other test relies on)."""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import (TARGET, compose, config_groups, environ_changes, hosts_override, hydra_compose, make_spec,
                      only_marks, validate)
from runner.spec.probe import FixedProbe
from runner.spec.schema import JobConfig


def test_compose_gives_the_typed_spec() -> None:
    spec = compose(f"recipe.target={TARGET}", "topology=2x2", "launcher=slurm")
    assert isinstance(spec, JobConfig)
    assert (spec.topology.nodes, spec.topology.devices_per_node, spec.launcher.kind) == (2, 2, "slurm")
    assert type(spec.recipe).__name__ == "DigitsRecipeConfig"


@pytest.mark.parametrize("overrides", [
    (),
    ("topology=2x2", "launcher=slurm", "launcher.slurm.partition=gpu", "init=file", "init.dir=/tmp"),
    ("topology=custom", "topology.hosts=[{name: a, addr: 10.0.0.1, devices: 2, gpus: [3, 1]}, {name: b}]"),
    ("recipe=custom", f"recipe.target={TARGET}", "+recipe.lr=0.1", "++recipe.momentum=0.9"),
    ("recipe=script", "recipe.path=train.py", "recipe.args=['--lr=0.1', 'a b']", "log.console=all"),
    ("sharding=zero", "+recipe.lr=0.1", "~recipe.lr", "launcher.mpi.export=[A, B]", "init.master_port=29500"),
    ("~recipe.epochs",),  # a schema's key cannot be deleted: both refuse
    ("+recipe.note='héllo'", "+recipe.epochs=3"),  # a key added to a schema's node; one it has: both refuse
    ("+backend.env={NCCL_DEBUG: INFO}",),  # `+` onto a mapping that is there merges into it
    # a choice in every group at once, in two orders, and a shape that is no file
    ("topology=hetero_2_1", "init=tcp", "launcher=mpi", "backend=gloo", "parallel=dp", "sharding=fsdp", "recipe=script"),
    ("recipe=custom", "sharding=oss", "parallel=ddp", "backend=nccl", "launcher=ssh", "init=file", "topology=3x5"),
    ("launcher=slurm", "topology=2x8", "launcher.tasks=per_device", "sharding=zero", "recipe.global_batch_size=64"),
])
def test_compose_gives_what_hydra_composes(overrides) -> None:
    """compose() composes each group option once, then Hydra's code sets the keys: the same spec as Hydra's, and the
    same refusals."""
    try:
        expected = OmegaConf.to_object(hydra_compose(*overrides))
    except Exception as refused:  # noqa: BLE001 (refused then too, in Hydra's words)
        with pytest.raises(type(refused)) as caught:
            compose(*overrides)
        assert str(caught.value) == str(refused)
        return
    assert compose(*overrides) == expected


def _every_option() -> list[str]:
    conf = importlib.resources.files("runner.conf")
    return sorted(f"{group}={option.name.removesuffix('.yaml')}" for group in config_groups()
                  for option in conf.joinpath(group).iterdir() if option.name.endswith(".yaml"))


@pytest.mark.parametrize("choice", _every_option())
def test_every_option_composes_as_hydra_composes_it(choice) -> None:
    """compose() takes a group's node from a composition of that option alone: true only while every option fills
    its own group and nothing else; an option that set another group's key would fail here."""
    group = choice.split("=")[0]
    others = [c for c in ("topology=2x2", "launcher=manual", "recipe=custom") if c.split("=")[0] != group]
    overrides = (*others, choice, f"recipe.target={TARGET}")
    assert compose(*overrides) == OmegaConf.to_object(hydra_compose(*overrides))


def test_hosts_override_round_trips() -> None:
    spec = compose(f"recipe.target={TARGET}", *hosts_override({"name": "a", "addr": "10.0.0.1", "devices": 2, "gpus": [3, 1]},
                                                            {"name": "b", "devices": 1}))
    hosts = spec.topology.hosts
    assert spec.topology.nodes is None and spec.topology.devices_per_node is None
    assert [(h.name, h.addr, h.devices, h.gpus) for h in hosts] == [("a", "10.0.0.1", 2, [3, 1]), ("b", None, 1, None)]


def test_validate_accepts_overrides_spec_or_probe() -> None:
    probe = FixedProbe(cuda_devices=2)
    got = validate((f"recipe.target={TARGET}", "topology=1x2"), probe)
    assert got.valid and got.probe is probe and got.job.device.value == "cuda"
    assert validate(make_spec(nodes=1, devices_per_node=3)).job.world_size == 3


def test_environ_changes_lists_every_kind_of_change() -> None:
    assert environ_changes({"A": "1", "B": "2"}, {"A": "1", "B": "2"}) == []
    assert environ_changes({"A": "1", "B": "2"}, {"A": "9", "C": "3"}) == [
        "added C='3'", "removed B (was '2')", "changed A: '1' -> '9'"]


def test_leak_fixture_fails_a_leaking_test(pytester, monkeypatch) -> None:
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    pytester.makepyfile(test_leaky="""
        import os

        def test_leaks():
            os.environ["RUNNER_LEAKED_VARIABLE"] = "x"

        def test_clean():
            pass

        def test_monkeypatched(monkeypatch):  # undone by monkeypatch before the leak check: no leak
            monkeypatch.setenv("RUNNER_MONKEYPATCHED_VARIABLE", "1")
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, errors=1)
    assert "RUNNER_MONKEYPATCHED_VARIABLE" not in result.stdout.str()
    result.stdout.fnmatch_lines(["*the test leaked environment variables*", "*added RUNNER_LEAKED_VARIABLE='x'*"])
    assert "RUNNER_LEAKED_VARIABLE" not in os.environ


def test_a_unit_test_that_starts_an_interpreter_fails_and_a_quick_program_passes(pytester, monkeypatch) -> None:
    """The guard of conftest.py: ``unit`` keeps meaning no Python interpreter started (pyproject's marker)."""
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    pytester.makepyfile("""
        import subprocess, sys
        import pytest

        @pytest.mark.unit
        def test_interpreter():
            subprocess.run([sys.executable, "-c", "pass"], check=True)

        @pytest.mark.unit
        def test_program():
            subprocess.run(["true"], check=True)

        def test_interpreter_unmarked():
            subprocess.run([sys.executable, "-c", "pass"], check=True)
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*AssertionError: a test marked unit started a Python interpreter*"])


def test_a_unit_test_that_imports_torch_fails_and_so_does_a_unit_session_whose_collection_imports_it(pytester,
                                                                                                    monkeypatch) -> None:
    """The guards of conftest.py: ``unit`` keeps meaning no torch imported (pyproject's marker), in a test and while
    a unit session collects; a module that marks no test unit is not even imported by one."""
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    pytester.makepyfile(test_inside="""
        import pytest

        @pytest.mark.unit
        def test_imports_torch():
            import torch

        @pytest.mark.unit
        def test_plain():
            pass
    """)
    pytester.makepyfile(test_e2e_only="import torch\n\ndef test_e2e():\n    pass\n")  # no unit test: not imported
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "-m", "unit")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*a test marked unit imported torch (first imported at *test_inside.py:5)*"])
    pytester.makepyfile(test_at_top="import pytest\nimport torch\n\n@pytest.mark.unit\ndef test_unit():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "-m", "unit")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stdout.fnmatch_lines(["*collecting the unit tests imported torch (first imported at *test_at_top.py:2)*"])


@pytest.mark.unit
def test_a_session_of_marked_tests_alone_is_told_apart_from_any_other_selection() -> None:
    """(Such a session imports only the test modules that mark tests so: tests/conftest.py, pytest_ignore_collect.)"""
    assert only_marks("unit") == {"unit"} and only_marks("unit or docs") == {"unit", "docs"}
    for other in ("", "not testbed", "unit and not slow", "(unit)", "unit or not docs"):
        assert only_marks(other) == frozenset(), other
