"""A copy of the job's code in its run folder (launcher.snapshot_code), so that an attempt started later (a
requeued Slurm job, a restart) runs the code that was submitted, not whatever the folder holds by then.

What is copied: the git-tracked files of the job's folder as they are now (edits not yet committed
included), or the files ``launcher.snapshot_files`` globs name. The copy keeps the folder's layout, so
``mypkg.train:main`` and ``train.py`` are found in it as in the folder; the processes still start in the
folder (data paths are unchanged) and import from the copy first (``code_dir``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


class SnapshotError(Exception):
    """The code cannot be copied; the message names the key and says what to do."""


@dataclass(frozen=True)
class Snapshot:
    folder: Path  # the copy
    files: int
    bytes: int
    source: str  # "git" or "launcher.snapshot_files"


def code_files(workdir: Path, globs: list[str]) -> tuple[list[Path], str] | None:
    """The files to copy, relative to ``workdir``, and what chose them; None: no git repository and no globs."""
    if globs:
        found = sorted({p.relative_to(workdir) for g in globs for p in workdir.glob(g) if p.is_file()})
        return found, "launcher.snapshot_files"
    try:
        done = subprocess.run(["git", "-C", str(workdir), "ls-files", "-z", "--cached", "--full-name", "."],
                              capture_output=True, timeout=30)
        top = subprocess.run(["git", "-C", str(workdir), "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0 or top.returncode != 0:
        return None
    root = Path(top.stdout.strip())
    names = [n for n in done.stdout.decode(errors="surrogateescape").split("\0") if n]
    files = []
    for name in names:
        path = root / name
        if path.is_file() and not path.is_symlink():  # a tracked file deleted since is not copied
            try:
                files.append(path.relative_to(workdir))
            except ValueError:
                continue
    return files, "git"


def take(workdir: Path, dest: Path, globs: list[str], max_mb: float, required: bool) -> Snapshot | None:
    """Copy the job's code into ``dest``; None when there is nothing to copy and it was not ``required``."""
    chosen = code_files(workdir, globs)
    if chosen is None:
        if required:
            raise SnapshotError(f"launcher.snapshot_code: {workdir} is not in a git repository, so there are no "
                                f"tracked files to copy; hint: name them with launcher.snapshot_files=['**/*.py'], or "
                                f"launcher.snapshot_code=false")
        return None
    files, source = chosen
    if not files:
        if required:
            named = f"launcher.snapshot_files={globs}" if globs else "git (no tracked file)"
            raise SnapshotError(f"launcher.snapshot_code: {named} names no file in {workdir}; hint: globs are relative "
                                f"to the job's folder, e.g. launcher.snapshot_files=['**/*.py'], or "
                                f"launcher.snapshot_code=false")
        return None
    sizes = {f: (workdir / f).stat().st_size for f in files}
    total = sum(sizes.values())
    if total > max_mb * 1e6:
        largest = ", ".join(f"{f} ({sizes[f] / 1e6:.1f} MB)" for f in sorted(sizes, key=sizes.get, reverse=True)[:3])
        raise SnapshotError(f"launcher.snapshot_code: the code to copy ({source}) is {total / 1e6:.1f} MB, over "
                            f"launcher.snapshot_max_mb={max_mb:g} (largest: {largest}); hint: keep data out of git "
                            f"or copy only the code: launcher.snapshot_files=['**/*.py','**/*.yaml'], or raise the cap")
    for rel in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(workdir / rel, target)
    os.chmod(dest, 0o755)
    return Snapshot(dest, len(files), total, source)


def moved(path: str, workdir: Path, snapshot: Path) -> str:
    """``path`` (a script, relative to workdir or absolute) in the snapshot, when it is one of its files."""
    source = Path(path) if os.path.isabs(path) else workdir / path
    try:
        rel = source.resolve().relative_to(workdir.resolve())
    except ValueError:
        return path  # outside the job's folder: not part of the snapshot
    copy = snapshot / rel
    return str(copy) if copy.is_file() else path
