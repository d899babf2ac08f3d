"""The ssh launch's data model, a leaf of runner.launchers.ssh: one host as the launch reaches it (:class:`SshHost`:
its three commands), the ssh client's options, and what a host's run folder gives back. Every other module of the
package imports it; it imports none of them."""

from __future__ import annotations

from dataclasses import dataclass

from runner.records.paths import RunPaths
from runner.spec.schema import SshOptions

KEEPALIVE_COUNT = 3  # ssh -o ServerAliveCountMax: unanswered keepalives before a host is lost


def collected(paths: RunPaths) -> tuple[str, ...]:
    """What a host's run folder gives back (runner.launchers.ssh.collect), relative to it: its ``logs/`` (its ranks'
    logs and records) and the metrics."""
    return tuple(p.relative_to(paths.root).as_posix() for p in (paths.logs, paths.metrics))


def ssh_base(opts: SshOptions) -> list[str]:
    """The ssh client and its options, before ``-- HOST COMMAND``. ``-T``: no terminal (the host's `run` reads its
    stdin, and a remote process must not outlive its session by a terminal's hang-up rules); BatchMode: a host that
    would ask for a password or a host key fails at once instead of waiting for an answer."""
    argv = [opts.command, "-T"]
    if opts.config_file:
        argv += ["-F", opts.config_file]
    if opts.user:
        argv += ["-l", opts.user]
    if opts.port:
        argv += ["-p", str(opts.port)]
    if opts.identity_file:
        argv += ["-i", opts.identity_file]
    argv += ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={opts.connect_timeout_s}"]
    if opts.keepalive_s:
        argv += ["-o", f"ServerAliveInterval={opts.keepalive_s}", "-o", f"ServerAliveCountMax={KEEPALIVE_COUNT}"]
    for option in opts.options:
        argv += ["-o", option]
    return argv


@dataclass(frozen=True, kw_only=True)
class SshHost:
    """One host of the job as the ssh launch reaches it: its three commands (the module docstring)."""

    index: int
    name: str  # the plan's name for it (its ranks' records say it)
    label: str  # how messages name it: "host 1 (b)"
    destination: str  # what ssh is given: its name (your ~/.ssh/config may alias it), else its address
    ranks: tuple[int, ...]
    run: str  # the `run` command there
    check: tuple[str, ...]
    dials: bool  # its check also dials host 0's rendezvous (runner.worker.reach)
    start: tuple[str, ...]
    collect: tuple[str, ...]
