"""What produced a run, recorded in its folder (``provenance.json``): the git commit of the job's folder, whether
it was dirty and the diff (size-capped), the installed packages, the torch build, the hosts and the command
line. `run` writes it without importing torch (its own process never does); rank 0 adds what only a running
torch knows (:func:`runtime`: the CUDA, cuDNN and NCCL it loaded, the devices), under ``runtime``."""

from __future__ import annotations

import getpass
import importlib.metadata
import importlib.util
import json
import platform
import re
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from runner.common.files import write_atomically

DIFF_CAP_BYTES = 256 * 1024  # a dirty tree's diff beyond this is cut (the record says so)
GIT_TIMEOUT_S = 10.0
UNTRACKED_CAP = 200


@dataclass(frozen=True, kw_only=True)
class GitState:
    commit: str | None  # None: not a git repository (or git is missing)
    branch: str | None = None
    dirty: bool = False
    changed: tuple[str, ...] = ()  # `git status --porcelain` lines of tracked files (what makes it dirty)
    untracked: tuple[str, ...] = ()  # files git does not track nor ignore, at most UNTRACKED_CAP names
    diff: str = ""  # `git diff HEAD` (tracked files), at most DIFF_CAP_BYTES
    diff_cut: bool = False
    root: str | None = None


def _git(folder: str, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", folder, *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def git_state(folder: str) -> GitState:
    """The state of the git repository that holds ``folder``."""
    commit = _git(folder, "rev-parse", "HEAD")
    if commit is None:
        return GitState(commit=None)
    branch = (_git(folder, "rev-parse", "--abbrev-ref", "HEAD") or "").strip() or None
    status = [line for line in (_git(folder, "status", "--porcelain", "--untracked-files=no") or "").splitlines()
              if line.strip()]
    untracked = [n for n in (_git(folder, "ls-files", "--others", "--exclude-standard", "--directory") or "").splitlines()
                 if n.strip()][:UNTRACKED_CAP]
    diff = _git(folder, "diff", "HEAD") or ""
    cut = len(diff.encode()) > DIFF_CAP_BYTES
    if cut:
        diff = diff.encode()[:DIFF_CAP_BYTES].decode(errors="ignore")
    root = (_git(folder, "rev-parse", "--show-toplevel") or "").strip() or None
    return GitState(commit=commit.strip(), branch=None if branch == "HEAD" else branch, dirty=bool(status),
                    changed=tuple(status), untracked=tuple(untracked), diff=diff, diff_cut=cut, root=root)


def installed_packages() -> list[str]:
    """``name==version`` of every distribution this interpreter sees, sorted (what `pip freeze` lists)."""
    found = {}
    for dist in importlib.metadata.distributions():
        named = _name_and_version(dist)
        if named is not None:
            found[named[0].lower()] = f"{named[0]}=={named[1]}"
    return [found[k] for k in sorted(found)]


def _name_and_version(dist: importlib.metadata.Distribution) -> tuple[str, str] | None:
    """A distribution's Name and Version, read from its metadata's header lines: ``dist.metadata`` parses the whole
    file as an e-mail, and ``dist.version`` again (25 ms of every `run` for this venv's 74 packages; 3 ms so)."""
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break  # the headers end at the first blank line; the description follows
        key, _, value = line.partition(":")
        if key in ("Name", "Version"):
            fields.setdefault(key, value.strip())
    if not fields.get("Name") or "Version" not in fields:
        return None
    return fields["Name"], fields["Version"]


def torch_build() -> dict[str, str | None]:
    """torch's version and the CUDA it was built for, read from its files (importing it takes over a second)."""
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return {"torch": None, "cuda": None}
    cuda = None
    spec = importlib.util.find_spec("torch")
    if spec and spec.submodule_search_locations:
        text = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text(errors="replace")
        m = re.search(r"^cuda\s*:\s*\S*\s*=\s*['\"]([^'\"]+)['\"]", text, re.M) or \
            re.search(r"^cuda\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
        cuda = m.group(1) if m else None
    return {"torch": version, "cuda": cuda}


@dataclass(frozen=True, kw_only=True)
class Provenance:
    run_id: str
    time: float
    command: list[str]
    cwd: str
    workdir: str
    user: str
    machine: str
    python: str
    hosts: list[str]
    git: GitState
    build: dict[str, str | None]
    packages: list[str] = field(default_factory=list)
    code_snapshot: str | None = None  # the run's copy of the code, when launcher.snapshot_code

    def document(self) -> dict[str, Any]:
        return asdict(self)


def record(run_id: str, workdir: str, hosts: list[str], code_snapshot: str | None = None) -> Provenance:
    """What produces this run, here and now."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "?"
    return Provenance(run_id=run_id, time=time.time(), command=list(sys.argv), cwd=str(Path.cwd()), workdir=workdir,
                      user=user, machine=socket.gethostname(),
                      python=f"{platform.python_implementation()} {platform.python_version()} ({sys.executable})",
                      hosts=hosts, git=git_state(workdir), build=torch_build(), packages=installed_packages(),
                      code_snapshot=code_snapshot)


def runtime(device_kind: str) -> dict[str, Any]:
    """What the running torch uses, from a rank (torch imported already): its version, the CUDA, cuDNN and NCCL it
    loaded, the device kind and, on CUDA, the GPUs this process sees."""
    import torch

    found: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": device_kind,
                             "cudnn": None, "nccl": None, "gpus": []}
    if torch.cuda.is_available():
        found["cudnn"] = torch.backends.cudnn.version()
        found["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    try:
        version = torch.cuda.nccl.version()  # (major, minor, patch); raises where torch was built without NCCL
        found["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    except (AttributeError, RuntimeError):
        pass
    return found


def add_runtime(path: Path, found: dict[str, Any], host: str, attempt: int) -> None:
    """Add rank 0's :func:`runtime` to the run's provenance.json (replaced atomically; a record `run` did not
    write, as a task started by hand, is left alone)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    doc["runtime"] = {**found, "host": host, "attempt": attempt}
    write_atomically(path, json.dumps(doc, indent=1))


def code_line(doc: dict[str, Any]) -> str:
    """The job's code in one line, from a provenance.json document: its commit, whether the tree was dirty, and
    whether the job ran from its snapshot."""
    git = doc.get("git") or {}
    if git.get("commit") is None:
        line = "not a git repository"
    else:
        line = f"git {git['commit'][:12]}" + (f" ({git['branch']})" if git.get("branch") else "")
        changed = len(git.get("changed") or [])
        line += f", dirty: {changed} tracked file(s) changed (the diff: provenance.json)" if git.get("dirty") \
            else ", clean"
    return line + (" · ran from its copy in code/" if doc.get("code_snapshot") else "")
