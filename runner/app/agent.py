"""The launch agent: a process forked as `run` starts, that starts this host's zygote (runner.worker.zygote: a
fresh interpreter that imports torch, from which the ranks are forked) and imports torch itself while `run` composes
and validates the spec, has the zygote try the recipe target for validation (runner.spec.targets), then runs this
host's share when handed the launch.

Importing torch takes over a second and Hydra's composition about half of one; on a machine with a
core to spare they overlap, and the recipe's module (which imports torch first, as a rule) is tried in a
child that has torch already, as the ranks will have it. Without the agent (one core, a multirun) `run` does both
in-process.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from dataclasses import dataclass

from typing import TYPE_CHECKING

from runner.common import exits
from runner.common.signals import kill_child, passing_on
from runner.spec.targets import TargetProblem, target_problem

if TYPE_CHECKING:  # imported once the zygote has started (runner.app.start: as early as `run` can)
    from runner.launchers.base import Launcher, LaunchOutcome, LaunchRequest
    from runner.worker.share import HostShare


# arguments of `run` that mean no job is validated here (help, the composed config, the forms of runner.app.cli.main
# that are no job), or several are (a multirun: its jobs are validated and launched in-process, one after another)
_NO_JOB = ("--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i", "--multirun", "-m", "--run", "-r",
           "--shell-completion", "-sc", "--version", "--reach", "--ssh-host")
# arguments of `run` that mean it forks no process here: the launchers whose processes a scheduler, mpirun or ssh
# starts elsewhere (those whose capabilities do not fork here: tests/app/test_agent.py), and a dry run
_NOTHING_FORKED_HERE = ("launcher=mpi", "launcher=slurm", "launcher=ssh", "dry_run=true", "dry_run=True")


@dataclass(frozen=True, kw_only=True)
class WholeLaunch:
    """`run` hands the agent a launch to run (its launcher, made with no way to run a share of its own, and its
    request), whose shares the agent's zygote forks (runner.launchers.base.AgentRuns.launch); the answer is the
    :class:`~runner.launchers.base.LaunchOutcome`."""

    launcher: Launcher
    request: LaunchRequest


@dataclass(frozen=True, kw_only=True)
class TargetQuestion:
    """`run` asks the agent to try a recipe target as the ranks will import it; the answer is its
    :class:`~runner.spec.targets.TargetProblem`, or None."""

    target: str
    workdir: str | None  # the job's folder, first on the path (runner.spec.targets)


def _agent_main(requests_fd: int, answers_fd: int) -> None:
    """Serve `run`'s messages, pickled on a pipe: a :class:`TargetQuestion` is answered at once (its problem or
    None); a :class:`~runner.worker.share.HostShare` is run (this host's processes), then the agent exits with its
    status; a :class:`WholeLaunch` is run, its outcome answered, and the agent exits. The closed pipe without a share
    or a launch: `run` needed neither."""
    from runner.worker.rank_process import die_with_parent
    from runner.worker.zygote import Zygote

    die_with_parent()
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)  # Ctrl-\ is for `run` to answer (runner.app.launch); ranks dump stacks
    zygote = Zygote.start()
    try:
        from runner.worker.host_agent import launch_host
        from runner.worker.share import HostShare

        with os.fdopen(requests_fd, "rb") as requests, os.fdopen(answers_fd, "wb") as answers:
            while True:
                try:
                    message = pickle.load(requests)
                except EOFError:
                    os._exit(0)
                if isinstance(message, (HostShare, WholeLaunch)):
                    break
                # in a child of the zygote, which has imported torch as the ranks will have
                pickle.dump(zygote.target_problem(message.target, message.workdir), answers)
                answers.flush()
            if isinstance(message, WholeLaunch):
                message.launcher.zygote = lambda: zygote
                outcome = message.launcher.launch(message.request)
                pickle.dump(outcome, answers)
                answers.flush()
                code = outcome.code
            else:
                code = launch_host(message, zygote)
    except KeyboardInterrupt:
        code = exits.from_signal(signal.SIGINT)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = exits.FAILED
    zygote.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class LaunchAgent:
    """The parent's handle on the agent process."""

    def __init__(self, pid: int, requests_fd: int, answers_fd: int) -> None:
        self.pid = pid
        self._requests = os.fdopen(requests_fd, "wb")
        self._answers = os.fdopen(answers_fd, "rb")

    def _send(self, message: TargetQuestion | HostShare | WholeLaunch) -> None:
        pickle.dump(message, self._requests)
        self._requests.flush()

    @staticmethod
    def useful(argv: list[str], cpus: int, script: bool = False) -> bool:
        """Whether `run ARGV` on a machine of ``cpus`` cores gains from an agent: one job to validate and launch, a
        core to spare for the agent's torch import while `run` composes, and work for its zygote: ranks forked here,
        or a recipe target to try (all a dry run, or launcher=slurm, mpi and ssh, whose processes start elsewhere, ask
        of it). A ``script`` (`run ... -- train.py`) has no target to try, so where nothing is forked here no agent
        imports torch: `run launcher=slurm -- train.py` on a login node spends no CPU-second on it."""
        if cpus < 2 or any(a in _NO_JOB for a in argv):
            return False
        return not (script and any(a in _NOTHING_FORKED_HERE for a in argv))

    @classmethod
    def start_if_useful(cls, argv: list[str], script: bool = False) -> "LaunchAgent | None":
        if not cls.useful(argv, os.cpu_count() or 1, script):
            return None
        requests_read, requests_write = os.pipe()
        answers_read, answers_write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(requests_write)
            os.close(answers_read)
            _agent_main(requests_read, answers_write)
        os.close(requests_read)
        os.close(answers_write)
        return cls(pid, requests_write, answers_read)

    def target_problem(self, target: str, workdir: str | None) -> TargetProblem | None:
        """runner.spec.targets.target_problem, in a child of the agent: the agent has imported torch by then,
        which the recipe's module usually imports first."""
        try:
            self._send(TargetQuestion(target=target, workdir=workdir))
            return pickle.load(self._answers)
        except (EOFError, OSError):  # the agent is gone (it says why on stderr): ask from here
            return target_problem(target, workdir)

    def launch(self, launcher: Launcher, request: LaunchRequest) -> LaunchOutcome:
        """Have the agent run ``launcher``'s launch (:class:`WholeLaunch`; ``launcher`` made without ``run_host`` or
        ``zygote``: the agent's own are used) and wait for its outcome; SIGINT, SIGTERM and the stop signal reaching
        `run` go to the agent, as :meth:`run_host` passes them on."""
        from runner.launchers.base import LaunchOutcome

        with passing_on(launcher.plan.rules.stop_signal, lambda signum: os.kill(self.pid, signum)):
            self._send(WholeLaunch(launcher=launcher, request=request))
            self._requests.close()
            try:
                outcome = pickle.load(self._answers)
            except (EOFError, pickle.UnpicklingError):  # the agent died before it answered (it said why on stderr)
                outcome = None
            _, status = os.waitpid(self.pid, 0)
        return outcome if outcome is not None else LaunchOutcome(code=exits.from_wait_status(status))

    def run_host(self, share: HostShare) -> int:
        """Hand this host's share to the agent and wait for its exit status; SIGINT, SIGTERM and the stop signal
        reaching `run` go to it."""
        with passing_on(share.plan.rules.stop_signal, lambda signum: os.kill(self.pid, signum)):
            self._send(share)
            self._requests.close()
            _, status = os.waitpid(self.pid, 0)  # retried after each forwarded signal (PEP 475)
        return exits.from_wait_status(status)

    def dismiss(self) -> None:
        """Nothing more for the agent to do (a dry run, or a launcher whose processes a scheduler or another host
        starts): it is killed now, not left to finish importing torch for nothing (seconds of CPU)."""
        kill_child(self.pid)
        self.cancel()

    def cancel(self) -> None:
        """No launch after all: the agent exits once it reads the closed pipe."""
        try:
            self._requests.close()
        except OSError:
            pass
