"""Folders in this machine's temporary folder that a process owns while it lives, and the removal of those whose owner
is gone.

A host agent's ranks get a scratch folder each (their TMPDIR), and the job's own etcd member keeps its data in one;
their owner removes them when it ends. An owner killed outright (SIGKILL, the OOM killer, a lost host's `run` ended by
its test) cannot, and /tmp is not emptied on every machine's boot. So each such folder holds a lock file on which its
owner holds an flock(2) while it lives (the kernel drops the lock when the process ends, however it ends: no process
id to be reused), and whoever makes one next on the machine first removes those whose lock it can take.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from pathlib import Path

PREFIX = "runner-"  # every folder of this module's, in the machine's temporary folder
LOCK = ".owner"  # in each: the lock file its owner holds


class OwnedFolder:
    """A folder of the machine's temporary folder, held (its lock taken) from :meth:`make` to :meth:`remove`."""

    def __init__(self, path: Path, lock_fd: int) -> None:
        self.path, self._lock_fd = path, lock_fd

    @classmethod
    def make(cls, path: Path) -> OwnedFolder:
        """Make ``path`` afresh (anything there before is removed) and hold it. The lock file is made under a name of
        its own, locked, then renamed to :data:`LOCK`: a sweep never sees an unlocked lock file of a live owner."""
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(mode=0o700)
        return cls(path, _hold(path))

    @classmethod
    def make_unique(cls, name: str) -> OwnedFolder:
        """A new folder ``runner-<name>-<random>`` of the machine's temporary folder, held."""
        path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{name}-"))
        return cls(path, _hold(path))

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1


def _hold(path: Path) -> int:
    fresh = path / f"{LOCK}.{os.getpid()}"
    fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)  # (not passed on to programs it starts)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(fresh, path / LOCK)
    return fd


def remove_abandoned(root: Path | None = None) -> list[Path]:
    """Remove the folders of :data:`PREFIX` in ``root`` (the machine's temporary folder) whose owner has ended: their
    lock can be taken. Folders without a lock file (made otherwise, or by an older version) and those of other users
    are left. The folders removed."""
    root = Path(tempfile.gettempdir()) if root is None else root
    removed = []
    try:
        with os.scandir(root) as found:
            entries = [e for e in found if e.name.startswith(PREFIX)]
    except OSError:
        return removed
    for entry in entries:
        try:
            fd = os.open(os.path.join(entry.path, LOCK), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # no lock file, not a folder, or not ours to read
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its owner lives
            os.close(fd)
            continue
        shutil.rmtree(entry.path, ignore_errors=True)  # (the lock held meanwhile: a second sweep passes it by)
        os.close(fd)
        removed.append(Path(entry.path))
    return removed
