"""runner.environments.provenance: the git state of the job's folder (clean, dirty with its diff, untracked files
apart, the diff's cap), the summary's line, the installed packages and torch's build, and rank 0's runtime."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
from dataclasses import asdict
from pathlib import Path

import pytest

from runner.environments import provenance


def git(folder: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(folder), "-c", "user.email=t@t", "-c", "user.name=t", *args], check=True,
                          capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    (root / "train.py").write_text("VERSION = 1\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", ".")
    git(root, "commit", "-qm", "init")
    return root


@pytest.mark.unit
def test_a_clean_tree(repo) -> None:
    (repo / "outputs").mkdir()
    (repo / "outputs" / "run.log").write_text("a run's own folder is not a change to the code\n")
    state = provenance.git_state(str(repo))
    assert state.commit == git(repo, "rev-parse", "HEAD").strip() and state.branch == "main"
    assert not state.dirty and state.changed == () and state.diff == "" and state.untracked == ("outputs/",)
    doc = {"git": asdict(state)}
    assert provenance.code_line(doc) == f"git {state.commit[:12]} (main), clean"


@pytest.mark.unit
def test_a_dirty_tree_keeps_its_diff(repo) -> None:
    (repo / "train.py").write_text("VERSION = 2\n")
    state = provenance.git_state(str(repo))
    assert state.dirty and state.changed == (" M train.py",)
    assert "-VERSION = 1\n+VERSION = 2\n" in state.diff and not state.diff_cut
    line = provenance.code_line({"git": asdict(state), "code_snapshot": "/run/code"})
    assert line == f"git {state.commit[:12]} (main), dirty: 1 tracked file(s) changed (the diff: provenance.json) " \
                   f"· ran from its copy in code/"


@pytest.mark.unit
def test_a_large_diff_is_cut(repo, monkeypatch) -> None:
    monkeypatch.setattr(provenance, "DIFF_CAP_BYTES", 100)
    (repo / "train.py").write_text("x = 1\n" * 500)
    state = provenance.git_state(str(repo))
    assert state.diff_cut and len(state.diff.encode()) <= 100


@pytest.mark.unit
def test_outside_a_repository(tmp_path) -> None:
    state = provenance.git_state(str(tmp_path))
    assert state.commit is None
    assert provenance.code_line({"git": asdict(state)}) == "not a git repository"


def test_the_record_names_packages_torch_hosts_and_command(repo) -> None:  # (the record asks torch: not unit)
    doc = provenance.record("r1", str(repo), ["node0", "node1"]).document()
    json.dumps(doc)  # written as JSON
    assert doc["run_id"] == "r1" and doc["hosts"] == ["node0", "node1"] and doc["workdir"] == str(repo)
    import torch

    assert doc["build"]["torch"] == torch.__version__ and doc["build"]["cuda"] == torch.version.cuda
    assert f"torch=={torch.__version__}" in doc["packages"]
    assert any(p.startswith("hydra-core==") for p in doc["packages"])


def test_rank_0_adds_the_runtime(tmp_path) -> None:  # (the runtime is torch's: not unit)
    path = tmp_path / "provenance.json"
    path.write_text(json.dumps({"run_id": "r1"}))
    provenance.add_runtime(path, provenance.runtime("cpu"), "node0", 1)
    doc = json.loads(path.read_text())
    import torch

    assert doc["run_id"] == "r1"
    assert doc["runtime"]["torch"] == torch.__version__ and doc["runtime"]["host"] == "node0"
    assert doc["runtime"]["attempt"] == 1 and doc["runtime"]["device"] == "cpu"
    assert list(tmp_path.iterdir()) == [path]  # replaced in place, no temporary file left
    provenance.add_runtime(tmp_path / "missing.json", {}, "node0", 0)  # a task started by hand: no record
    assert not (tmp_path / "missing.json").exists()


@pytest.mark.unit
def test_the_packages_are_what_the_metadata_parser_reads() -> None:
    """The header lines read for each package's name and version (25 ms of every `run` less) give
    what importlib.metadata's own parser gives, for every package this interpreter sees."""
    parsed = {d.metadata["Name"].lower(): f"{d.metadata['Name']}=={d.version}"
              for d in importlib.metadata.distributions() if d.metadata["Name"]}
    assert provenance.installed_packages() == [parsed[k] for k in sorted(parsed)]
    assert any(p.startswith("torch==") for p in provenance.installed_packages())
