"""What "lost" means in a job that outlives its hosts, whichever launcher runs it: one that gives a sign of life every
keepalive interval (an ssh host's report line and the launching `run`'s beat, a Slurm task's Alive, a launcher=manual
host's lease in etcd) and then gives none for :data:`BEATS_MISSED` intervals is lost (its `run`, its machine or its
network gone). Where a connection closes (an ssh session, a task's output), it is lost at once."""

from __future__ import annotations

BEATS_MISSED = 4  # keepalive intervals a host (or the `run` that holds the job, as a host sees it) may miss


def silent_after_s(every_s: float) -> float:
    """Seconds without a sign of life after which a host that says one every ``every_s`` is lost."""
    return BEATS_MISSED * every_s
