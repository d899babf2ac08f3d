"""runner.app.start: `run`'s entry point starts the launch agent (and with it the zygote that imports torch) before
`run` imports Hydra, and reads only `run`'s own arguments to decide whether it is worth starting."""

from __future__ import annotations

import subprocess
import sys

import pytest

from runner.app.start import _before_the_script



def test_the_entry_point_imports_nothing_heavy_before_the_agent_starts() -> None:
    seen = subprocess.run([sys.executable, "-c", "import sys, runner.app.start, runner.app.agent; "
                           "print(sorted(m for m in ('hydra', 'omegaconf', 'torch') if m in sys.modules))"],
                          capture_output=True, text=True, check=True).stdout
    assert seen.strip() == "[]"


@pytest.mark.unit
def test_only_runs_own_arguments_decide_whether_the_agent_is_started() -> None:
    assert _before_the_script(["topology=1x2", "--", "-m", "pkg.train"]) == ["topology=1x2"]
    assert _before_the_script(["-m", "topology=1x1,1x2", "--", "train.py"]) == ["-m", "topology=1x1,1x2"]
    assert _before_the_script(["topology=1x2"]) == ["topology=1x2"]
