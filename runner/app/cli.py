"""`run`: the Hydra application. Compose -> validate -> plan -> launch (or print, with dry_run=true).

Exit status: 0 success (or a valid dry run), 2 an invalid spec or override (nothing was started),
otherwise what the job returned.
"""

from __future__ import annotations

import difflib
import functools
import logging
import os
import secrets
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from hydra.core.plugins import Plugins

from runner.app.agent import LaunchAgent
from runner.app.argv_checks import input_problems
from runner.app.help import options_help
from runner.app.launch import run_job
from runner.app.script_shorthand import ScriptArgsError, script_overrides
from runner.app.start import not_a_job
from runner.app.sweep_launchers import LAUNCHER
from runner.app.sweep_outcome import SweepOutcome
from runner.app.topology_shapes import register_named_shapes
from runner.common import exits
from runner.environments.process import ProcessEnvironment
from runner.launchers.base import Invocation
from runner.launchers.slurm.array import ArrayMember
from runner.records.job_exits import JobExit, record_exit
from runner.spec.hostfile import with_hostfile
from runner.spec.problems import Problem, render_problems
from runner.spec.schema import JobConfig, register_schemas, unknown_keys

if TYPE_CHECKING:
    from runner.worker.zygote import Zygote


_STARTED = time.strftime("%Y%m%d-%H%M%S")


@functools.cache
def _uid() -> str:
    return secrets.token_hex(3)


def register(argv: Sequence[str] = ()) -> None:
    """Register schemas, resolvers (``runner_options``: `run --help`'s options, for conf/job.yaml's help template),
    our sweep launcher, and the ``topology=NxM`` shapes that ``argv`` (`run`'s arguments, or the overrides of a
    compose) may ask for; idempotent (tests compose through Hydra's API too)."""
    register_schemas()
    register_named_shapes(argv)
    # our sweep launcher: Hydra's scan of hydra_plugins does not see into an editable install
    from hydra_plugins.runner_sweep_launcher import RunnerSweepLauncher
    Plugins.instance().register(RunnerSweepLauncher)
    if not OmegaConf.has_resolver("runner_uid"):
        OmegaConf.register_new_resolver("runner_uid", _uid)
    if not OmegaConf.has_resolver("runner_run_dir"):
        OmegaConf.register_new_resolver("runner_run_dir", run_dir)
    if not OmegaConf.has_resolver("runner_options"):
        OmegaConf.register_new_resolver("runner_options", options_help)


def run_dir(run_id: str | None) -> str:
    """A run's folder under outputs/: ``runs/<run id>`` for a pinned run id, the same on every host and at every
    launch (a relaunch with the same run id continues the run: its checkpoint, its logs), else
    ``<date>/<time>_<random>``, new for each run."""
    if run_id:
        return f"runs/{run_id}"
    return time.strftime("%Y-%m-%d/%H-%M-%S", time.strptime(_STARTED, "%Y%m%d-%H%M%S")) + f"_{_uid()}"


class JobTask:
    """`run`'s Hydra task: one job from its composed config (runner.app.launch.run_job), called by Hydra once, or
    once per job of a sweep. :func:`main` makes it with what `run` read and started as it began (its environment,
    its launch agent), and reads back what it kept once Hydra returns: whether Hydra got as far as a job
    (``entered``), and how a sweep's jobs ended (``sweep``)."""

    def __init__(self, environment: ProcessEnvironment, agent: LaunchAgent | None) -> None:
        self.environment = environment
        self.agent = agent
        # the ranks' when `run` runs them itself, and where it tries the jobs' targets: one for every job of a sweep
        self._zygote: Zygote | None = None
        self.entered = False  # a later exit status 1 is then the job's, not Hydra's refusal of the config
        self.sweep = SweepOutcome()

    def zygote(self) -> Zygote:
        """The zygote `run` forks ranks from when it runs a host's share itself (runner.worker.zygote), started once."""
        if self._zygote is None:
            from runner.worker.zygote import Zygote

            self._zygote = Zygote.start()
        return self._zygote

    def close(self) -> None:
        """The sweep is over (or its jobs are Slurm's now: runner_sweep_launcher): its zygote ends."""
        if self._zygote is not None:
            self._zygote.close()
            self._zygote = None

    def __call__(self, cfg: DictConfig) -> JobExit | ArrayMember | None:
        """The job's outcome, for a sweep's launcher (a JobReturn's value); a single run exits with its status."""
        self.entered = True
        hc = HydraConfig.get()
        out = Path(hc.runtime.output_dir)
        multirun = hc.mode is RunMode.MULTIRUN
        run_id = f"{_STARTED}-{_uid()}" + (f"-{hc.job.num}" if multirun else "")
        config_dir = next((s.path for s in hc.runtime.config_sources if s.provider == "command-line"), None)
        try:
            spec = typed_spec(cfg)
        except SpecRefused as e:
            print(e, file=sys.stderr)
            sys.exit(exits.INVALID)
        if multirun and spec.run_id:
            # one run id for the whole sweep: each job gets its own, as its own folder and ports need
            spec.run_id = f"{spec.run_id}-{hc.job.num}"
        # a sweep under our Hydra launcher sends its Slurm batch jobs together, as job arrays
        in_array_sweep = multirun and hc.launcher.get("_target_") == LAUNCHER
        invocation = Invocation(python=spec.launcher.python or sys.executable, cwd=os.getcwd(),
                                overrides=tuple(hc.overrides.task), config_dir=config_dir,
                                config_name=hc.job.config_name if hc.job.config_name != "job" else None,
                                run_command=_run_command())
        code = run_job(spec, out=out, run_id=run_id, invocation=invocation, environment=self.environment,
                       agent=self.agent, defer_submit=in_array_sweep, zygote=self.zygote)
        if isinstance(code, ArrayMember):
            self.sweep.deferred(code.folder)  # the launcher submits it with the others, and records how it ended
            return code
        if multirun:  # a failed job does not stop the sweep; the summary and the exit say it
            ended = record_exit(out, code)
            self.sweep.ended(ended)
            return ended
        if code:
            sys.exit(code)
        return None


def _run_command() -> str:
    """This `run` executable's absolute path (a venv's bin need not be on every host's PATH)."""
    argv0 = sys.argv[0]
    return os.path.abspath(argv0) if os.path.basename(argv0) == "run" and os.path.exists(argv0) else "run"


class SpecRefused(Exception):
    """The composed config cannot be the typed spec; the message is why, as `run` prints it."""


def typed_spec(cfg: DictConfig) -> JobConfig:
    """The composed config as the typed spec. Raises SpecRefused with why it cannot be one (a key no schema has, a
    mandatory value left at ???, a value of the wrong type), as `run` prints it."""
    unknown = unknown_keys(cfg)
    if unknown:
        problems = [Problem(key, "is not a key of the spec", f"known here: {', '.join(known)}"
                            + (f"; did you mean {close[0]}?" if (close := difflib.get_close_matches(key.rsplit('.', 1)[-1], known, 1)) else ""))
                    for key, known in unknown]
        raise SpecRefused(f"{render_problems(problems)}\n\nthe spec has {len(problems)} error(s); nothing was started.")
    try:
        spec = OmegaConf.to_object(cfg)
    except MissingMandatoryValue as e:
        key = e.full_key or "?"
        raise SpecRefused(render_problems([Problem(key, "has no value (??? in the config)", f"set it: {key}=...")])) \
            from None
    except OmegaConfBaseException as e:
        raise SpecRefused(f"error: {e.full_key or 'spec'}: {e.msg}") from None
    spec, problems = with_hostfile(spec, os.getcwd())
    if problems:
        raise SpecRefused(f"{render_problems(problems)}\n\nthe spec has {len(problems)} error(s); nothing was started.")
    return spec


def main(agent: LaunchAgent | None = None) -> None:
    """Console entry point (after runner.app.start, which may have started the launch ``agent``). Three forms are not
    jobs (:func:`runner.app.start.not_a_job`); the rest is a job, or a sweep of jobs, composed by Hydra."""
    not_a_job(sys.argv[1:])  # (runner.app.start has answered these before it started an agent)
    sys.argv[1:] = _checked_argv(sys.argv[1:], agent)
    register(sys.argv[1:])
    task = JobTask(ProcessEnvironment.read(), agent)
    # The user's modules are imported from the job's folder by the ranks, and tried by validation in a
    # child process (runner.spec.targets); `run` itself never puts that folder on its path, so nothing there
    # (a runner.py, a hydra/ folder) can shadow what `run` imports.
    code = _sweep_status(_hydra_main(task), task)
    if task.agent is not None:
        task.agent.cancel()
    task.close()
    _leave(code)


def _checked_argv(argv: list[str], agent: LaunchAgent | None) -> list[str]:
    """The command line Hydra is to read: a script and its arguments made overrides (runner.app.script_shorthand),
    checked first (runner.app.argv_checks). A refusal is said, and `run` exits 2."""
    try:
        argv = script_overrides(argv)
    except ScriptArgsError as e:
        if agent is not None:
            agent.dismiss()
        print(f"error: {e}", file=sys.stderr)
        sys.exit(exits.INVALID)
    problems = input_problems(argv)
    if problems:
        if agent is not None:
            agent.dismiss()
        print("\n".join(problems), file=sys.stderr)
        print("\nnothing was started.", file=sys.stderr)
        _leave(exits.INVALID)
    return argv


def _hydra_main(task: JobTask) -> int:
    """Hydra runs ``task`` (once, or once a job of a sweep); the exit status it ended with."""
    try:
        hydra.main(version_base=None, config_path="pkg://runner.conf", config_name="job")(task)()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
        if code == 1 and not task.entered:
            # Hydra already printed why (unknown key, option, type); it exits 1 for that, we say 2
            print("hint: `run --help` lists every group and option; `run --cfg job` prints the composed spec",
                  file=sys.stderr)
            return exits.INVALID
        return code
    return 0


def _sweep_status(code: int, task: JobTask) -> int:
    """`run`'s status after a sweep: stopped by a signal, or failed when any of its jobs did (each job's own status is
    in the sweep's summary); ``code`` as it is otherwise."""
    codes = [ended.code for ended in task.sweep.exits()]
    stopped = task.sweep.stopped()
    if code == 0 and stopped:
        print(f"\nthe sweep was stopped ({signal.Signals(exits.signal_of(stopped)).name}) after {len(codes)} job(s)",
              file=sys.stderr)
        return stopped
    if code == 0 and any(codes):
        failed = sum(1 for c in codes if c)
        print(f"\n{failed} of {len(codes)} job(s) of the sweep failed (see the summary)", file=sys.stderr)
        return exits.FAILED
    return code


def _leave(code: int) -> None:
    """Everything is written and closed: skip the interpreter's teardown (over half a second with torch loaded), as
    the ranks do."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
