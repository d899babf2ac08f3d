"""runner.spec.targets: one function loads a recipe target for the ranks, and validation runs that same
function in a forked child; what it refuses, and how it says it."""

from __future__ import annotations

import os
import select
import sys
import textwrap
import time
from pathlib import Path

import pytest

from runner.spec.targets import TargetError, load_target, split_target, target_problem, target_trial, use_workdir

pytestmark = pytest.mark.unit


@pytest.fixture
def folder(tmp_path: Path, monkeypatch) -> Path:
    """A user's folder with a package of recipes; sys.path and sys.modules as they were afterwards."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "modules", dict(sys.modules))
    pkg = tmp_path / "userpkg_t"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    files = {
        "good.py": "def main(ctx, cfg):\n    return {'ok': 1}\n\ndef other(ctx, cfg, *rest):\n    pass\n",
        "arity.py": "def main(ctx):\n    pass\n",
        "value.py": "main = 3\n",
        "broken.py": "x = 1\nraise ValueError('bad config at import')\n",
        "missing_dep.py": "import no_such_dependency_t\n",
        "printing.py": "print('hello from import')\nimport sys\nprint('to stderr', file=sys.stderr)\ndef main(ctx, cfg):\n    pass\n",
        "exits.py": "import os\nos._exit(9)\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(textwrap.dedent(text))
    (tmp_path / "nsp_t").mkdir()  # a namespace package
    return tmp_path


def test_split() -> None:
    assert split_target("a.b:f") == ("a.b", "f") and split_target("a.b") == ("a.b", "main")


def test_the_job_folder_comes_first_once(folder) -> None:
    use_workdir(str(folder))
    use_workdir(str(folder))
    assert sys.path[0] == str(folder) and sys.path.count(str(folder)) == 1


def test_a_target_loads_from_the_job_folder(folder) -> None:
    assert load_target("userpkg_t.good:main", str(folder))(None, None) == {"ok": 1}
    assert load_target("userpkg_t.good:other", str(folder)).__name__ == "other"  # extra parameters with defaults


@pytest.mark.parametrize("target, says", [
    ("userpkg_t.good:nope", "module 'userpkg_t.good' ({}/userpkg_t/good.py) defines no 'nope'; its functions: main, other"),
    ("userpkg_t.arity", "userpkg_t.arity:main(ctx) ({}/userpkg_t/arity.py) cannot be called as main(ctx, cfg), as recipes are"),
    ("userpkg_t.value", "userpkg_t.value:main ({}/userpkg_t/value.py) is a int, not a function"),
    ("nsp_t:main", "module 'nsp_t' (a namespace package) defines no 'main'"),
])
def test_what_the_module_does_not_define_is_refused(folder, target, says) -> None:
    with pytest.raises(TargetError) as e:
        load_target(target, str(folder))
    assert str(e.value) == says.format(folder)
    problem = target_problem(target, str(folder))
    assert problem is not None and problem.message == says.format(folder)
    assert "recipe.target=" in problem.hint


def test_a_module_that_is_not_there(folder) -> None:
    problem = target_problem("userpkg_missing_t.train:main", str(folder))
    assert problem.message == (f"module 'userpkg_missing_t.train' cannot be imported: no module named 'userpkg_missing_t' "
                               f"(looked in {folder} first, then the installed packages)")
    assert "set workdir=" in problem.hint


def test_a_module_that_raises_or_lacks_a_dependency_names_its_line(folder) -> None:
    raised = target_problem("userpkg_t.broken", str(folder))
    assert raised.message == f"importing 'userpkg_t.broken' raised ValueError: bad config at import at {folder}/userpkg_t/broken.py:2"
    lacking = target_problem("userpkg_t.missing_dep", str(folder))
    assert lacking.message == (f"importing 'userpkg_t.missing_dep' raised ModuleNotFoundError: No module named "
                               f"'no_such_dependency_t' at {folder}/userpkg_t/missing_dep.py:1")


def test_the_old_name_of_the_bundled_recipes_points_to_the_new(folder) -> None:
    assert "recipe.target=runner.recipes.digits:main" in target_problem("recipes.digits:main", str(folder)).hint


def test_the_check_happens_in_a_child_that_leaves_this_process_as_it_was(folder, capfd) -> None:
    assert target_problem("userpkg_t.printing", str(folder)) is None
    assert "userpkg_t.printing" not in sys.modules and str(folder) not in sys.path
    out, err = capfd.readouterr()
    assert "hello from import" not in out and "to stderr" not in err  # the child's output is not shown


def test_a_module_that_ends_the_process_while_importing(folder) -> None:
    problem = target_problem("userpkg_t.exits", str(folder))
    assert problem.message == "importing 'userpkg_t.exits' ended the process without an answer (a crash in native code?)"


def test_a_module_that_hangs_while_importing(folder) -> None:
    (folder / "userpkg_t" / "hangs.py").write_text("import time\ntime.sleep(60)\n")
    problem = target_problem("userpkg_t.hangs", str(folder), timeout_s=0.1)
    assert problem.message == "importing 'userpkg_t.hangs' took longer than 0.1 s"


def test_a_trial_started_now_is_answered_when_asked_once_and_its_child_is_gone(folder) -> None:
    trial = target_trial("userpkg_t.good:nope", str(folder))  # the child imports while this process goes on
    first = trial.answer()
    assert first is not None and first.message.startswith("module 'userpkg_t.good' (") and trial.answer() is first
    with pytest.raises(ChildProcessError):
        os.waitpid(trial.pid, os.WNOHANG)  # reaped


def test_a_trial_asked_for_after_its_deadline_is_answered_by_what_its_child_said_in_time(folder) -> None:
    """A session's early trial may be asked for long after it started (a worker's first validation comes after its
    long tests): the child's answer counts, not the time it is read at."""
    trial = target_trial("userpkg_t.good:nope", str(folder), timeout_s=60)
    select.select([trial.answers], [], [], 60)  # the child has answered (or ended)
    trial.deadline = time.monotonic() - 1  # ... and the deadline has passed since
    said = trial.answer()
    assert said is not None and said.message.startswith("module 'userpkg_t.good' (")
