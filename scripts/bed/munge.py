"""The bed's own munged, Slurm's authentication: its key, socket and files under the bed's state directory."""

from __future__ import annotations

import os

from bed.common import tail
from bed.layout import Paths
from bed.processes import spawn, wait_for


def start_munge(paths: Paths) -> None:
    """Our own munged: fresh key (mode 0400), socket, pid, log and seed files under DIR/munge."""
    paths.munge.mkdir(mode=0o755, exist_ok=True)  # munged wants its socket folder searchable by all
    fd = os.open(paths.munge_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    with os.fdopen(fd, "wb") as f:
        f.write(os.urandom(1024))
    spawn(paths, "munged", [
        "munged", "--foreground", "--force",
        f"--socket={paths.munge_socket}", f"--key-file={paths.munge_key}",
        f"--pid-file={paths.munge / 'munged.pid'}", f"--log-file={paths.log('munged')}",
        f"--seed-file={paths.munge / 'munged.seed'}",
    ])
    # in the foreground munged logs to stderr (logs/munged.out), whatever --log-file says
    wait_for("munged socket", paths.munge_socket.exists, 15, lambda: tail(paths.logs / "munged.out"), daemons=paths)
