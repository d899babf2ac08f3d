"""runner.spec.probe: what validation asks of a machine, answered by values (FixedProbe) or by this machine
(LocalProbe), which asks only what a rule needs; a process a launch started asks this machine what is its own, and
takes the launching `run`'s word for the recipe target (LaunchedProbe)."""

from __future__ import annotations

import socket

import pytest

from runner.spec import probe as probes
from runner.spec.probe import FixedProbe, LaunchedProbe, LocalProbe

pytestmark = pytest.mark.unit


def test_a_fixed_probe_answers_its_values_and_records_what_it_was_asked() -> None:
    fixed = FixedProbe(cuda_devices=2, paths=frozenset({"/data/train.py"}), names=frozenset({"gpu-a"}),
                       missing_extras=frozenset({"plots"}))
    got = (fixed.cuda_device_count(), fixed.mpi_backend_available(), fixed.extra_installed("fairscale"),
           fixed.extra_installed("plots"))
    assert got == (2, False, True, False)
    assert fixed.asked == ["cuda", "mpi", "fairscale", "plots"]
    assert fixed.exists("/data/train.py") and fixed.exists("/tmp") and not fixed.exists("/nope")
    assert fixed.is_dir("/shared") and not fixed.is_dir("/data/train.py")
    assert fixed.host_names() == frozenset({"gpu-a"})


def test_this_machine_is_asked_only_what_a_rule_needs(tmp_path, monkeypatch) -> None:
    local = LocalProbe(try_target=lambda target, workdir: f"tried {target} in {workdir}",
                       try_module=lambda module, workdir: f"found {module}")
    assert local.target_problem("pkg.train:main", "/work") == "tried pkg.train:main in /work"
    assert local.module_problem("pkg", None) == "found pkg"
    (tmp_path / "f").write_text("")
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    assert local.exists(str(tmp_path / "f")) and local.exists(str(tmp_path / "link"))  # a dangling link exists
    assert local.is_dir(str(tmp_path)) and not local.is_dir(str(tmp_path / "f"))
    names = local.host_names()
    assert socket.gethostname() in names and "127.0.0.1" in names
    monkeypatch.setattr(probes, "_nvidia_driver_present", lambda: False)
    assert LocalProbe().cuda_device_count() == 0  # no driver: no GPU, and torch is not imported to say so


def test_a_launched_process_asks_this_machine_what_is_its_own_and_trusts_the_launch_with_the_target(tmp_path) -> None:
    """The recipe target and a script's module were tried by the launching `run`: nothing is tried here, not even a
    module that cannot import; folders and names are this machine's."""
    launched = LaunchedProbe()
    assert launched.target_problem("no_such_package.train:main", str(tmp_path)) is None
    assert launched.module_problem("no_such_package.train", str(tmp_path)) is None
    assert LocalProbe().target_problem("no_such_package.train:main", str(tmp_path)) is not None  # (tried, it fails)
    (tmp_path / "f").write_text("")
    assert launched.is_dir(str(tmp_path)) and not launched.is_dir(str(tmp_path / "f"))
    assert launched.exists(str(tmp_path / "f")) and not launched.exists(str(tmp_path / "gone"))
    assert socket.gethostname() in launched.host_names()


def test_a_fixed_probe_tries_each_target_once_and_the_runners_own_once_for_every_folder_without_one(tmp_path) -> None:
    """(A test session validates thousands of specs: the bundled recipe is imported in one child, not one a spec.)"""
    mine, shadowing = tmp_path / "job", tmp_path / "shadowing"
    mine.mkdir()
    (shadowing / "runner").mkdir(parents=True)
    assert probes._trial_key("runner.recipes.digits:main", str(mine)) == ("runner.recipes.digits:main", None)
    assert probes._trial_key("runner.recipes.digits:main", str(shadowing)) == ("runner.recipes.digits:main",
                                                                              str(shadowing))
    assert probes._trial_key("pkg.train:main", str(mine)) == ("pkg.train:main", str(mine))
    fixed = FixedProbe()
    said = fixed.target_problem("json:no_such_function", str(mine))
    assert said is not None and fixed.target_problem("json:no_such_function", str(mine)) is said  # kept, not tried again
