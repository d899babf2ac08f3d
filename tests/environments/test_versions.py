"""Which runner and torch this machine has, as `run --version` says it, and that line read back
(runner.environments.versions): what launcher=ssh's check compares on every host. `run --version` itself:
tests/app/test_cli.py; a host with another torch: tests/e2e/test_ssh.py."""

from __future__ import annotations

import sys

import pytest

from runner.environments.versions import Versions, installed


def test_run_version_is_read_back() -> None:
    here = installed()
    assert Versions.parse(here.line()) == here
    assert here.torch.split("+")[0] == __import__("torch").__version__.split("+")[0]


@pytest.mark.unit
def test_the_line_names_the_distribution_and_the_interpreter_and_is_found_among_others() -> None:
    v = Versions("0.1.0", "2.13.0+cpu", "3.11.7")
    assert v.line() == f"run 0.1.0 (torch-jobspec), torch 2.13.0+cpu, Python 3.11.7 ({sys.executable})"
    assert v.short() == "runner 0.1.0, torch 2.13.0+cpu"
    said = f"a profile's greeting\n  {v.line()}  \n{Versions('9', '9', '9').line()}\n"
    assert Versions.parse(said) == v  # the first line that is one, spaces around it
    assert Versions.parse("run 0.1.0 (another-runner), torch 2.13.0, Python 3.11.7\nHydra 1.3.2\n") is None
