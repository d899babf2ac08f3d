"""The ssh launch's check, before anything starts: every host at once, each with its check command
(``cd <workdir> && exec <run> --version``, or ``... --reach <host 0's rendezvous> <node>``, which prints the versions
too: runner.launchers.ssh.launcher). A host passes when ssh logs in within the connect timeout, the job's folder is
there, `run` is there, its runner and torch are this machine's, and it reaches host 0's rendezvous. Each failure is
said with the host, why, a hint, and the exact command to try by hand."""

from __future__ import annotations

import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor

from runner.worker.reach import Reached
from runner.environments.versions import Versions
from runner.launchers.ssh.host import SshHost

ANSWER_S = 60  # after the connection: how long `run --version` may take on a busy host (it imports no torch)
REACH_FAILED = "host 0's rendezvous: "  # how a check that could not reach host 0's rendezvous begins its why

# what ssh says when it cannot log in, and the hint for it (the first that matches)
_SSH_HINTS = (
    ("Permission denied", "is this machine's key in its authorized_keys (ssh-copy-id HOST), or the right key given "
                          "(launcher.ssh.identity_file, your ssh agent)?"),
    ("Host key verification failed", "its host key is unknown here: log in once by hand to accept it, or "
                                     "'launcher.ssh.options=[\"StrictHostKeyChecking=accept-new\"]'"),
    ("Could not resolve hostname", "the name does not resolve here: /etc/hosts, DNS, or an alias in ~/.ssh/config"),
    ("Connection refused", "no sshd listens there (is it running? another port: launcher.ssh.port)"),
    ("timed out", "the host does not answer: is it up and reachable from here (a ProxyJump in ~/.ssh/config)?"),
    ("No route to host", "the host is not reachable from here"),
)


def _last_lines(text: str, n: int = 3) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " / ".join(lines[-n:]) or "(nothing on stderr)"


def verdict(host: SshHost, code: int, out: str, err: str, here: Versions) -> tuple[str, str] | None:
    """Why ``host`` fails the check, from its check command's exit status and output, and a hint; None: it passes."""
    if code == 255:
        hint = next((h for needle, h in _SSH_HINTS if needle in err), "ssh's own words above say why")
        return f"ssh could not log in (exit 255): {_last_lines(err)}", hint
    run = host.run
    if code in (126, 127):
        return (f"{run} is not there or cannot run (exit {code}: {_last_lines(err)})",
                "install the runner there (the same version), or name it: launcher.ssh.run=/path/to/venv/bin/run")
    if code != 0 and " cd" in f" {err}":
        return (f"the job's folder is not there (exit {code}: {_last_lines(err)})",
                "check your code out at the same path on every host, or name one they all have: workdir=/path")
    if code != 0:
        return f"the check failed (exit {code}): {_last_lines(err)}", "try it by hand (below)"
    there = Versions.parse(out)
    if there is None:
        return f"{run} --version said no versions: {_last_lines(out + err)}", "is it this runner's `run`?"
    if (there.runner, there.torch) != (here.runner, here.torch):
        return (f"runner {there.runner} and torch {there.torch} there, runner {here.runner} and torch {here.torch} "
                f"here", "install the same runner and torch on every host")
    if not host.dials:
        return None
    reached = Reached.parse(out)
    if reached is None:
        return f"{run} --reach said no answer: {_last_lines(out + err)}", "is it this runner's `run`?"
    return None if reached.ok else (f"{REACH_FAILED}{reached.said}", reached.hint)


def _check(host: SshHost, timeout_s: float, here: Versions) -> tuple[str, str] | None:
    try:
        done = subprocess.run(host.check, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"no answer within {timeout_s:g} s", "is the host overloaded, or the connection stuck?"
    except FileNotFoundError:
        return f"{host.check[0]!r} is not on PATH", "install an ssh client, or name it: launcher.ssh.command=/path/to/ssh"
    return verdict(host, done.returncode, done.stdout, done.stderr, here)


def failures(hosts: tuple[SshHost, ...], here: Versions, connect_timeout_s: float) -> dict[SshHost, tuple[str, str]]:
    """Every host's check, all at once: each host that fails it, with why and a hint (empty: every host passed)."""
    with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        found = list(pool.map(lambda h: _check(h, connect_timeout_s + ANSWER_S, here), hosts))
    return {host: failed for host, failed in zip(hosts, found) if failed is not None}


def paragraph(host: SshHost, why: str, hint: str, said: str = "error") -> str:
    """A host's failed check in words: why, the hint, and the command to try by hand."""
    return f"{said}: launcher=ssh: {host.label}: {why}\n    hint: {hint}\n    try by hand: {shlex.join(host.check)}"
