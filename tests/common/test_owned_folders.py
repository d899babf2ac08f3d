"""Folders of the temporary folder held by a live process stay; those of an owner killed outright go at the next
sweep (runner.common.owned_folders)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from runner.common.owned_folders import LOCK, OwnedFolder, remove_abandoned

pytestmark = pytest.mark.unit


@contextmanager
def held_by_another_process(path: Path) -> Iterator[int]:
    """``path`` made and held by a forked process, which waits until it is killed: its pid."""
    ready_r, ready_w = os.pipe()
    hold_r, hold_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the owner: holds the folder until it is killed
        try:
            OwnedFolder.make(path)
            os.write(ready_w, b"x")
            os.read(hold_r, 1)
        finally:
            os._exit(0)
    try:
        assert os.read(ready_r, 1) == b"x"
        yield pid
    finally:
        os.close(hold_w)
        for fd in (ready_r, ready_w, hold_r):
            os.close(fd)
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):  # killed and reaped by the test already
            pass


def test_a_folder_stays_while_its_owner_lives_and_goes_once_it_was_killed(tmp_path):
    with held_by_another_process(tmp_path / "runner-a-0-1") as pid:
        (tmp_path / "runner-a-0-1" / "socket-dir").mkdir()
        assert remove_abandoned(tmp_path) == [] and (tmp_path / "runner-a-0-1" / LOCK).exists()
        os.kill(pid, signal.SIGKILL)  # as a lost host's `run` is killed: nothing of it runs its cleanup
        os.waitpid(pid, 0)
        assert (tmp_path / "runner-a-0-1").exists()  # left behind, until the next sweep
        assert remove_abandoned(tmp_path) == [tmp_path / "runner-a-0-1"]
        assert not (tmp_path / "runner-a-0-1").exists()


def test_folders_without_a_lock_file_or_of_another_name_are_left(tmp_path):
    (tmp_path / "runner-old").mkdir()  # no lock file: made otherwise (an older version)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / LOCK).touch()
    (tmp_path / "runner-a-file").write_text("not a folder")
    assert remove_abandoned(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "runner-a-file", "runner-old"]


def test_its_owner_removes_it_and_a_folder_made_again_starts_empty(tmp_path):
    first = OwnedFolder.make(tmp_path / "runner-b-0-0")
    (first.path / "left").write_text("from before")
    first.remove()
    assert not first.path.exists()
    (tmp_path / "runner-b-0-0").mkdir()
    (tmp_path / "runner-b-0-0" / "left").write_text("from an agent killed outright")
    again = OwnedFolder.make(tmp_path / "runner-b-0-0")
    assert sorted(p.name for p in again.path.iterdir()) == [LOCK]
    assert remove_abandoned(tmp_path) == []  # held by this process
    again.remove()
