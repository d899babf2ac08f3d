"""runner.app.snapshot: the files a snapshot copies (git's tracked files, edits included, or launcher.snapshot_files
globs), its layout, its size cap, and a script's path moved into it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from runner.app.snapshot import SnapshotError, code_files, moved, take

pytestmark = pytest.mark.unit


def git(folder: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(folder), "-c", "user.email=t@t", "-c", "user.name=t", *args], check=True,
                   capture_output=True)


@pytest.fixture
def repo(tmp_path) -> Path:
    """A repository with a package, a script, a data file ignored by git and one untracked file."""
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "train.py").write_text("VERSION = 1\n")
    (root / "train.py").write_text("print('hi')\n")
    (root / ".gitignore").write_text("data/\n")
    (root / "data").mkdir()
    (root / "data" / "big.bin").write_bytes(b"x" * 1000)
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-qm", "init")
    (root / "notes.txt").write_text("untracked\n")
    return root


def test_git_tracked_files_as_they_are_now(repo, tmp_path) -> None:
    (repo / "pkg" / "train.py").write_text("VERSION = 2  # not committed yet\n")
    copy = take(repo, tmp_path / "code", [], max_mb=1, required=True)
    assert copy is not None and copy.source == "git"
    found = sorted(str(p.relative_to(copy.folder)) for p in copy.folder.rglob("*") if p.is_file())
    assert found == [".gitignore", "pkg/__init__.py", "pkg/train.py", "train.py"]  # no data/, no untracked file
    assert (copy.folder / "pkg" / "train.py").read_text() == "VERSION = 2  # not committed yet\n"
    assert copy.files == 4 and copy.bytes == sum((repo / f).stat().st_size for f in found)


def test_a_job_folder_inside_a_repository_copies_its_own_files(repo, tmp_path) -> None:
    copy = take(repo / "pkg", tmp_path / "code", [], max_mb=1, required=True)
    assert sorted(p.name for p in copy.folder.iterdir()) == ["__init__.py", "train.py"]


def test_globs_choose_instead_of_git(repo, tmp_path) -> None:
    files, source = code_files(repo, ["**/*.py"])
    assert source == "launcher.snapshot_files"
    assert [str(f) for f in files] == ["pkg/__init__.py", "pkg/train.py", "train.py"]


def test_outside_a_repository(tmp_path) -> None:
    (tmp_path / "plain").mkdir()
    assert code_files(tmp_path / "plain", []) is None
    assert take(tmp_path / "plain", tmp_path / "code", [], max_mb=1, required=False) is None
    with pytest.raises(SnapshotError, match=r"not in a git repository.*launcher.snapshot_files=\['\*\*/\*.py'\]"):
        take(tmp_path / "plain", tmp_path / "code", [], max_mb=1, required=True)


def test_globs_that_name_no_file_are_refused_when_a_copy_is_asked_for_and_copy_nothing(tmp_path) -> None:
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "train.py").write_text("")
    assert take(tmp_path / "job", tmp_path / "code", ["*.nomatch"], max_mb=1, required=False) is None
    with pytest.raises(SnapshotError) as e:
        take(tmp_path / "job", tmp_path / "code", ["*.nomatch"], max_mb=1, required=True)
    assert str(e.value) == (f"launcher.snapshot_code: launcher.snapshot_files=['*.nomatch'] names no file in "
                            f"{tmp_path / 'job'}; hint: globs are relative to the job's folder, e.g. "
                            f"launcher.snapshot_files=['**/*.py'], or launcher.snapshot_code=false")
    assert not (tmp_path / "code").exists()


def test_too_large_names_the_largest_files_and_copies_nothing(repo, tmp_path) -> None:
    (repo / "weights.pt").write_bytes(b"w" * 600_000)
    git(repo, "add", "weights.pt")
    with pytest.raises(SnapshotError) as e:
        take(repo, tmp_path / "code", [], max_mb=0.5, required=True)
    assert "0.6 MB, over launcher.snapshot_max_mb=0.5 (largest: weights.pt (0.6 MB)" in str(e.value)
    assert "launcher.snapshot_files=" in str(e.value)
    assert not (tmp_path / "code").exists()


def test_a_script_moves_into_the_copy_when_it_is_one_of_its_files(repo, tmp_path) -> None:
    copy = take(repo, tmp_path / "code", [], max_mb=1, required=True)
    assert moved("train.py", repo, copy.folder) == str(copy.folder / "train.py")
    assert moved(str(repo / "train.py"), repo, copy.folder) == str(copy.folder / "train.py")
    assert moved("notes.txt", repo, copy.folder) == "notes.txt"  # untracked: not in the copy
    assert moved("/elsewhere/x.py", repo, copy.folder) == "/elsewhere/x.py"
