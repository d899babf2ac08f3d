"""What the ssh launcher's unit tests share: a launcher=ssh job of two hosts (a: 2 devices, b: 1), composed and
pinned as `run` does, with its SshLauncher (no host is reached)."""

from __future__ import annotations

from pathlib import Path

from conftest import compose, environment, hosts_override, validate
from runner.launchers import Invocation
from runner.launchers import plan_for
from runner.launchers.ssh.launcher import SshLauncher
from runner.records.paths import RunPaths
from runner.spec.pins import pinned

AB = hosts_override({"name": "a", "devices": 2}, {"name": "b", "devices": 1})


def ssh_launcher(tmp_path: Path, *overrides: str, cwd: str = "/work/proj", root: Path | None = None,
                 **env: str) -> SshLauncher:
    """The launcher of `run launcher=ssh device=cpu <hosts a and b> OVERRIDES` started in ``cwd``, its run folder
    ``root`` (default: tmp_path/outputs/runs/R1), with ``env`` as this machine's variables to export."""
    got = validate(compose("launcher=ssh", "device=cpu", "recipe.global_batch_size=60", *AB, *overrides))
    assert got.valid, got.rendered()
    paths = RunPaths(root or tmp_path / "outputs" / "runs" / "R1", "R1")
    job = pinned(got.job, SshLauncher.pins(got.job, paths))
    return SshLauncher(plan=plan_for(job, paths), paths=paths,
                       invocation=Invocation(python="/venv/bin/python", cwd=cwd, run_command="/venv/bin/run"),
                       environment=environment().with_exported(SshLauncher.exported_names(job.spec), env))
