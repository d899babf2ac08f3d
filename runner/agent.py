"""The launch agent: a process forked as `run` starts, that imports torch while `run` composes and
validates the spec, then starts this host's processes when handed the launch.

Importing torch takes over a second and Hydra's composition about half of one; on a machine with a
core to spare they overlap, and the ranks are still forked from a process that holds torch (and has
not initialised CUDA). Without the agent (one core, a dry run, a multirun) `run` launches in-process.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from collections.abc import Callable

from omegaconf import DictConfig

from runner.outputs import RunPaths
from runner.plan import Plan
from runner.stop import stop_signal

HostRun = Callable[[Plan, int, RunPaths, DictConfig], int]

# arguments of `run` that mean no launch follows in this process
_NO_LAUNCH = ("--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i", "--multirun", "-m", "--run", "-r",
              "--shell-completion", "-sc", "dry_run=true", "dry_run=True")


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _agent_main(read_fd: int) -> None:
    from runner.rank import die_with_parent

    die_with_parent()
    try:
        import torch.distributed.elastic.multiprocessing  # noqa: F401  (the point of the agent)

        from runner.host_launch import launch_host

        work = _read_all(read_fd)
        if not work:
            os._exit(0)  # `run` needed no launch
        code = launch_host(*pickle.loads(work))
    except KeyboardInterrupt:
        code = 128 + signal.SIGINT
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class LaunchAgent:
    """The parent's handle on the agent process."""

    def __init__(self, pid: int, write_fd: int) -> None:
        self.pid = pid
        self._write_fd = write_fd

    @classmethod
    def start_if_useful(cls, argv: list[str]) -> "LaunchAgent | None":
        # a scheduler starts the processes of launcher=slurm and mpi: nothing to fork here
        if (os.cpu_count() or 1) < 2 or any(a in _NO_LAUNCH or a in ("launcher=slurm", "launcher=mpi") for a in argv):
            return None
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(write_fd)
            _agent_main(read_fd)
        os.close(read_fd)
        return cls(pid, write_fd)

    def run_host(self, plan: Plan, node_rank: int, paths: RunPaths, recipe_cfg: DictConfig) -> int:
        """Hand the launch to the agent and wait for its exit status; SIGINT, SIGTERM and the stop signal
        reaching `run` go to it."""
        data = pickle.dumps((plan, node_rank, paths, recipe_cfg))
        forward = lambda signum, _frame: os.kill(self.pid, signum)  # noqa: E731
        stop = stop_signal(plan.job.spec.launcher.slurm.signal)  # a request to checkpoint and stop
        previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, stop)}
        try:
            with os.fdopen(self._write_fd, "wb") as pipe:
                pipe.write(data)
            _, status = os.waitpid(self.pid, 0)  # retried after each forwarded signal (PEP 475)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        code = os.waitstatus_to_exitcode(status)
        return code if code >= 0 else 128 - code

    def cancel(self) -> None:
        """No launch after all: the agent exits once it reads the closed pipe."""
        try:
            os.close(self._write_fd)
        except OSError:
            pass
