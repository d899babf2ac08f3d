"""After an ssh launch: each host's records in this run folder, where the host's run folder is not this one.

A host's `run` keeps the run in its own run folder (runner.launchers.ssh.launcher: the same path under the job's folder).
Where that is this very folder (the host is this machine, or a file system they share), its ranks' files are here
already: its first rank's log says so. From any other host that was not lost, its collect command sends its
``logs/`` (its ranks' logs, and on host 0 how every rank of every host ended: runner.worker.endings) and host 0's
``metrics.jsonl``, which are unpacked here without replacing a file this folder has. The run's summary then counts
every rank, with their logs.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from runner.launchers.ssh.host import SshHost, collected
from runner.records.paths import RunPaths

COLLECT_S = 60.0  # how long one host may take to send its records


def _wanted(name: str, wanted: tuple[str, ...]) -> bool:
    parts = Path(name).parts
    return bool(parts) and parts[0] in wanted and ".." not in parts


def unpack(stream: IO[bytes], paths: RunPaths) -> list[str]:
    """Files of the tar ``stream`` under what a host gives back (:func:`runner.launchers.ssh.collected`), into this
    run folder, none that exists there already; their names."""
    added, root, wanted = [], paths.root, collected(paths)
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for member in tar:
            if not member.isfile() or not _wanted(member.name, wanted) or (root / member.name).exists():
                continue
            tar.extract(member, root, filter="data")
            added.append(member.name)
    return added


def collect_host(host: SshHost, paths: RunPaths, taken: list[str] | None = None) -> str | None:
    """``host``'s records into this run folder (their names added to ``taken``); None, or why they could not be
    had."""
    proc = subprocess.Popen(host.collect, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    unpacked = None
    try:
        try:
            names = unpack(proc.stdout, paths)
            if taken is not None:
                taken.extend(names)
        except tarfile.ReadError as e:  # nothing came: the exit status and stderr say why (no such folder: the
            unpacked = f"{type(e).__name__}: {e}"  # host's `run` refused before it made one)
        _, err = proc.communicate(timeout=COLLECT_S)
    except (tarfile.TarError, OSError, subprocess.TimeoutExpired) as e:
        proc.kill()
        proc.wait()
        return f"{type(e).__name__}: {e}"
    if proc.returncode != 0:
        return f"exit {proc.returncode}: {err.decode(errors='replace').strip()[-300:]}"
    return unpacked


def collect(hosts: tuple[SshHost, ...], paths: RunPaths, lost: frozenset[int], replacing: Iterable[str] = ()) -> list[str]:
    """Every host's records that this run folder lacks, host 0's first (how every rank ended), from the hosts not
    lost; the names of those taken. ``replacing``: what an earlier round of the job took back (runner.launchers.ssh
    .attempts), removed first: this round's records replace them (what this folder holds of its own stays). A host
    whose records cannot be had is said in a line; the summary then counts what is here."""
    for name in replacing:
        (paths.root / name).unlink(missing_ok=True)
    taken: list[str] = []
    for host in hosts:
        if host.index in lost or not host.ranks or paths.rank(host.ranks[0]).log.exists():
            continue
        failed = collect_host(host, paths, taken)
        if failed is not None:
            print(f"ssh: {host.label}: its records stay in its own run folder ({failed})", file=sys.stderr, flush=True)
    return taken
