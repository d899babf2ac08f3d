"""One host's share of a job in a process a launch started with the run's pinned spec: an ssh host's `run
--ssh-host` (runner.app.ssh_host), a scheduler's task, and a task of a Slurm job's round (runner.app.task).

Whatever the mode, the path is one (:func:`run_share`): the spec, as the mode brings it → one validation here,
with what the launching `run` found (runner.spec.probe.LaunchedProbe: this host's own devices and folders are asked
here, the recipe target is not tried again) → this host's place in the plan, as the mode knows it → the run folder
made → the share (runner.worker.share: it restarts in place where the mode's share restarts itself) → the mode runs
it with a host agent and hears its holder (the `run` that started it and waits for it). When the holder is gone, the
share stops by itself, one way for every mode (:class:`HolderGone`, after :func:`runner.worker.share.hard_stop_s`);
how the holder is heard is the mode's: the launching `run`'s stream and beats for an ssh host, the holder's beat
file in the run folder for a Slurm round's task; a plain scheduler task has none (the scheduler ends it).

What differs between the modes is a small adapter each (:class:`HostMode`): how the spec arrives, where this host is
in the plan, and how its agent reports and hears its holder.

`run` under launcher=manual starts no such process: each host's `run` is a launch of its own, validated as any, and
in a job that outlives its hosts it hears its peers through their leases in etcd (runner.launchers.manual.watch),
which end the attempt, not the process.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from collections.abc import Callable
from typing import NoReturn, Protocol

from runner.common import exits
from runner.common.signals import StopRequest
from runner.environments.process import ProcessEnvironment
from runner.launchers import validate
from runner.plan.processes import Plan
from runner.records.paths import RunPaths
from runner.spec.job import Job
from runner.spec.probe import LaunchedProbe
from runner.spec.problems import render_problems
from runner.spec.schema import JobConfig
from runner.worker.share import HostShare, hard_stop_s, restarts_in_place


class Refused(Exception):
    """The share is refused before anything started; the message is why, as printed."""


@dataclass(frozen=True)
class Placed:
    """This host in the plan it made: node ``node`` of ``plan``, its run folder ``paths`` (at the first attempt),
    and ``only``: the one rank this process runs (a scheduler's task per process), or None: the host's every rank."""

    plan: Plan
    node: int
    paths: RunPaths
    only: int | None = None


class HostMode(Protocol):
    """How one mode runs a host's share (an adapter of a few dozen lines)."""

    @property
    def restarts_itself(self) -> bool:
        """Whether the share starts again after a rank's failure in this process (launcher.max_restarts)."""

    def spec(self) -> JobConfig:
        """The run's pinned spec, as it arrives in this mode. Raises Refused."""

    def place(self, job: Job, environment: ProcessEnvironment) -> Placed:
        """This host's place in the plan it makes here. Raises Refused."""

    def run(self, share: HostShare, only: int | None, early_stop: StopRequest | None, gone: HolderGone) -> int:
        """The share run to its end by a host agent (HostAgent(...).run()), its holder heard meanwhile (``gone``
        once it is gone); its exit status."""


def validated(spec: JobConfig) -> Job:
    """The job of a spec the launching `run` validated and pinned, validated again here with what it found
    (runner.spec.probe.LaunchedProbe). Raises Refused with the problems, rendered."""
    job, problems = validate(spec, LaunchedProbe())
    if job is None:
        raise Refused(render_problems(problems))
    return job


def run_share(mode: HostMode, environment: ProcessEnvironment, early_stop: StopRequest | None = None) -> int:
    """This host's share as ``mode`` brings it (the module docstring); its exit status. ``early_stop``: the stop
    signal caught before the host agent handles it (passed on to the ranks once they run)."""
    try:
        spec = mode.spec()
        placed = mode.place(validated(spec), environment)
    except Refused as e:
        print(e, file=sys.stderr)
        return exits.INVALID
    placed.paths.make()
    share = HostShare(plan=placed.plan, node_rank=placed.node, paths=placed.paths, environment=environment,
                      restarts=restarts_in_place(spec) if mode.restarts_itself else 0)
    return mode.run(share, placed.only, early_stop, HolderGone(hard_stop_s(spec.launcher)))


def enter(mode: HostMode | None, usage: str) -> NoReturn:
    """A host-side process from its start: its scheduler's (or the launching `run`'s) early stop remembered rather
    than died of (SIGUSR1, the default stop signal: the agent passes it on once its ranks have started), SIGQUIT
    ignored until its agent answers it (its ranks dump their stacks), then ``mode``'s share (None: a command line it
    does not take, ``usage`` said); the process ends with its status, skipping the interpreter's teardown."""
    early_stop = StopRequest()
    early_stop.install(signal.SIGUSR1)  # the default; the agent handles the spec's own once it is read
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    if mode is None:
        print(usage, file=sys.stderr)
        code = exits.INVALID
    else:
        code = run_share(mode, ProcessEnvironment.read(), early_stop)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def say(text: str) -> None:
    """A line on stderr, if anybody can read it: once the holder or the connection to it is gone, the stream's reader
    may be gone too, and writing raises (BrokenPipeError) where it must not stop this share from ending."""
    try:
        if text:
            print(text, file=sys.stderr)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


class HolderGone:
    """The holder of this share is gone (the launching `run` of an ssh host, the `run` that holds a Slurm job's
    rounds, or the way to it): the share stops as on SIGTERM (the ranks stop; a recipe checkpoints), and whatever
    still runs ``hard_stop_s`` later ends with this process, its ranks with it (PR_SET_PDEATHSIG). So nothing of a
    share outlives its holder. Called by the thread that heard it; the first call ends the process, a later one
    returns at once."""

    def __init__(self, hard_stop_s: float, sleep: Callable[[float], None] = time.sleep) -> None:
        self.hard_stop_s = hard_stop_s
        self._sleep = sleep  # (a test's clock: the wait asked for, without waiting)
        self._once = threading.Lock()

    def __call__(self, why: str) -> None:
        """``why``: the line that says so ("" for none)."""
        if not self._once.acquire(blocking=False):
            return
        try:
            say(why)
            os.kill(os.getpid(), signal.SIGTERM)
            self._sleep(self.hard_stop_s)
            say("")  # (what the agent wrote, if its stream is still there)
        finally:  # whatever happens above (a stream whose reader is gone raises): nothing outlives the holder
            os._exit(exits.from_signal(signal.SIGTERM))
