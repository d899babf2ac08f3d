"""`run [overrides] -- train.py --lr=0.1`: the script and its arguments as torchrun takes them, turned into
``recipe=script recipe.path=... recipe.args=[...]`` that compose back to exactly what was typed."""

from __future__ import annotations

import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import compose
from runner.app.script_shorthand import ScriptArgsError, script_overrides
from runs import TESTS, artifacts, run, run_folder

SCRIPT = TESTS / "scripts" / "report_script.py"


def composed(argv: list[str]):
    return compose(*script_overrides(argv)).recipe


def test_no_double_dash_leaves_the_arguments_alone() -> None:
    assert script_overrides(["topology=1x2", "-m"]) == ["topology=1x2", "-m"]


def test_the_script_and_its_arguments_become_the_script_recipe() -> None:
    recipe = composed(["topology=1x2", "--", "train.py", "--lr=0.1", "--out=/x", "a b", "it's"])
    assert recipe.path == "train.py" and recipe.args == ["--lr=0.1", "--out=/x", "a b", "it's"]
    assert recipe.target == "runner.worker.script:run_script" and recipe.module is None


@settings(max_examples=60, deadline=None)
@given(path=st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=20),
       args=st.lists(st.text(st.characters(blacklist_categories=("Cs",)), max_size=12), max_size=4))
def test_any_arguments_compose_back_exactly(path: str, args: list[str]) -> None:
    """Quotes, backslashes, commas, brackets, `${...}`, `=`, spaces: what Hydra's grammar and OmegaConf's
    interpolation would otherwise take for syntax arrives as typed."""
    recipe = composed(["--", path, *args])
    assert (recipe.path, recipe.args) == (path, args)


@pytest.mark.parametrize("argv, says", [
    (["--"], "nothing follows `--`"),
    (["recipe=digits", "--", "t.py"], "'recipe=digits' and `-- t.py ...` both say what to run"),
    (["recipe.args=[a]", "--", "t.py"], "'recipe.args=[a]' and `-- t.py ...`"),
    (["+recipe.path=x", "--", "t.py"], "'+recipe.path=x' and `-- t.py ...`"),
])
def test_clashes_are_refused(argv: list[str], says: str) -> None:
    with pytest.raises(ScriptArgsError) as e:
        script_overrides(argv)
    assert says in str(e.value) and "hint:" in str(e.value)


def test_a_clash_from_the_command_line_is_a_clear_error(tmp_path) -> None:
    done = run("recipe=digits", "--", "train.py", cwd=tmp_path)
    assert done.code == 2 and "both say what to run" in done.stderr and "Traceback" not in done.output


def test_the_shorthand_in_a_dry_run(tmp_path) -> None:
    shutil.copy(SCRIPT, tmp_path)
    dry = run("launcher=slurm", "dry_run=true", "--", "report_script.py", "--tag", "a b", cwd=tmp_path)
    assert dry.code == 0, dry.output
    assert "path: report_script.py" in dry.stdout and "  - a b\n" in dry.stdout


def test_the_shorthand_in_a_real_run(tmp_path) -> None:
    shutil.copy(SCRIPT, tmp_path)
    done = run("topology=1x2", "--", "report_script.py", "--tag", "x'y", cwd=tmp_path)
    assert done.code == 0, done.output
    found = artifacts(tmp_path / "art")
    assert sorted(found) == [0, 1] and {r["tag"] for r in found.values()} == {"x'y"}
    spec = (run_folder(tmp_path) / "spec.yaml").read_text()
    assert "path: report_script.py" in spec and "  - --tag\n  - x'y\n" in spec


def test_the_shorthand_in_a_sweep(tmp_path) -> None:
    shutil.copy(SCRIPT, tmp_path)
    done = run("-m", "topology=1x1,1x2", "--", "report_script.py", "--tag", "a,b", cwd=tmp_path, timeout=300)
    assert done.code == 0, done.output
    specs = sorted((tmp_path / "outputs" / "multirun").glob("*/*/*/spec.yaml"))
    assert len(specs) == 2 and all("  - a,b\n" in s.read_text() for s in specs)  # one value, not a sweep
    assert {r["world_size"] for r in artifacts(tmp_path / "art").values()} == {2}  # the last job's ranks


# ------------------------------------------------------------------------------ torchrun habits


def test_a_script_without_double_dash_starts_where_the_python_file_is() -> None:
    """`run topology=1x2 train.py --devices 2`, typed as for torchrun: the first argument that names a Python file
    starts the script; Hydra's own flags and their values, and overrides, stay `run`'s."""
    assert script_overrides(["topology=1x2", "train.py", "--devices", "2"]) == [
        "topology=1x2", "recipe=script", "recipe.path='train.py'", "recipe.args=['--devices','2']"]
    assert script_overrides(["--config-dir", "jobs", "-cn", "x.py", "topology=1x2"]) == [
        "--config-dir", "jobs", "-cn", "x.py", "topology=1x2"]  # a config name is not a script
    assert script_overrides(["topology=1x2", "~recipe.seed"]) == ["topology=1x2", "~recipe.seed"]


def test_a_file_that_exists_starts_the_script_whatever_its_name(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train").write_text("print(1)\n")
    assert script_overrides(["train", "--lr", "1"])[-2:] == ["recipe.path='train'", "recipe.args=['--lr','1']"]


def test_a_module_after_double_dash_runs_as_python_m() -> None:
    recipe = composed(["topology=1x2", "--", "-m", "pkg.train", "--lr", "0.1"])
    assert (recipe.module, recipe.path, recipe.args) == ("pkg.train", None, ["--lr", "0.1"])
    with pytest.raises(ScriptArgsError, match="`-m` names no module"):
        script_overrides(["--", "-m"])


@pytest.mark.parametrize("argv, says", [
    (["--nproc-per-node=4", "train.py"], "`--nproc-per-node=4` is torchrun's option; here: topology=1x4"),
    (["--nproc_per_node", "2", "train.py"], "`--nproc_per_node 2` is torchrun's option; here: topology=1x2"),
    (["--nnodes=2", "--", "train.py"], "`--nnodes=2` is torchrun's option; here: topology.nodes=2"),
    (["--standalone", "train.py"], "`--standalone` is torchrun's option; here: nothing"),
    (["--node-rank=1", "train.py"], "here: launcher=manual launcher.manual.host=1"),
    (["--max-restarts=3"], "here: launcher.max_restarts=3"),
])
def test_torchruns_options_are_refused_with_what_they_are_here(argv: list[str], says: str) -> None:
    with pytest.raises(ScriptArgsError) as e:
        script_overrides(argv)
    assert says in str(e.value) and "hint: run [overrides] -- train.py" in str(e.value)


def test_without_double_dash_in_a_real_run(tmp_path) -> None:
    shutil.copy(SCRIPT, tmp_path)
    done = run("run_id=plain1", "topology=1x2", "report_script.py", "--tag", "plain", cwd=tmp_path)
    assert done.code == 0, done.output
    assert {r["tag"] for r in artifacts(tmp_path / "art").values()} == {"plain"}


def test_a_word_that_is_neither_an_override_nor_a_script_is_a_clear_error(tmp_path) -> None:
    done = run("topology=1x2", "trian", cwd=tmp_path)
    assert done.code == 2 and "Traceback" not in done.output
    assert "error: 'trian' is neither an override (key=value) nor a script (no file 'trian' here)" in done.stderr
