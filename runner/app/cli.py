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

import runner.reports.sweep as sweep
from runner.app.agent import LaunchAgent
from runner.app.help import options_help
from runner.app.launch import run_job
from runner.app.topology_shapes import register_named_shapes
from runner.common import exits
from runner.environments import versions
from runner.environments.process import ProcessEnvironment
from runner.launchers.base import Invocation
from runner.launchers.slurm.array import ArrayMember
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
        self._zygote: Zygote | None = None  # the ranks' when `run` runs them itself: one for every job of a sweep
        self.entered = False  # a later exit status 1 is then the job's, not Hydra's refusal of the config
        self.sweep = sweep.SweepOutcome()

    def zygote(self) -> Zygote:
        """The zygote `run` forks ranks from when it runs a host's share itself (runner.worker.zygote), started once."""
        if self._zygote is None:
            from runner.worker.zygote import Zygote

            self._zygote = Zygote.start()
        return self._zygote

    def close(self) -> None:
        """The sweep is over: its zygote ends."""
        if self._zygote is not None:
            self._zygote.close()
            self._zygote = None

    def __call__(self, cfg: DictConfig) -> sweep.JobExit | ArrayMember | None:
        """The job's outcome, for a sweep's launcher (a JobReturn's value); a single run exits with its status."""
        self.entered = True
        hc = HydraConfig.get()
        out = Path(hc.runtime.output_dir)
        multirun = hc.mode is RunMode.MULTIRUN
        run_id = f"{_STARTED}-{_uid()}" + (f"-{hc.job.num}" if multirun else "")
        config_dir = next((s.path for s in hc.runtime.config_sources if s.provider == "command-line"), None)
        spec = typed_spec(cfg)
        if isinstance(spec, str):
            print(spec, file=sys.stderr)
            sys.exit(exits.INVALID)
        if multirun and spec.run_id:
            # one run id for the whole sweep: each job gets its own, as its own folder and ports need
            spec.run_id = f"{spec.run_id}-{hc.job.num}"
        # a sweep under our Hydra launcher sends its Slurm batch jobs together, as job arrays
        in_array_sweep = multirun and hc.launcher.get("_target_") == sweep.LAUNCHER
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
            ended = sweep.record_exit(out, code)
            self.sweep.ended(ended)
            return ended
        if code:
            sys.exit(code)
        return None


def _run_command() -> str:
    """This `run` executable's absolute path (a venv's bin need not be on every host's PATH)."""
    argv0 = sys.argv[0]
    return os.path.abspath(argv0) if os.path.basename(argv0) == "run" and os.path.exists(argv0) else "run"


def typed_spec(cfg: DictConfig) -> JobConfig | str:
    """The composed config as the typed spec, or why it cannot be one (a key no schema has, a mandatory value
    left at ???, a value of the wrong type), as `run` prints it."""
    unknown = unknown_keys(cfg)
    if unknown:
        problems = [Problem(key, "is not a key of the spec", f"known here: {', '.join(known)}"
                            + (f"; did you mean {close[0]}?" if (close := difflib.get_close_matches(key.rsplit('.', 1)[-1], known, 1)) else ""))
                    for key, known in unknown]
        return f"{render_problems(problems)}\n\nthe spec has {len(problems)} error(s); nothing was started."
    try:
        spec = OmegaConf.to_object(cfg)
    except MissingMandatoryValue as e:
        key = e.full_key or "?"
        return render_problems([Problem(key, "has no value (??? in the config)", f"set it: {key}=...")])
    except OmegaConfBaseException as e:
        return f"error: {e.full_key or 'spec'}: {e.msg}"
    spec, problems = with_hostfile(spec, os.getcwd())
    if problems:
        return f"{render_problems(problems)}\n\nthe spec has {len(problems)} error(s); nothing was started."
    return spec


def _config_dir(argv: list[str]) -> str | None:
    for i, a in enumerate(argv):
        if a.startswith(("--config-dir=", "-cd=")):
            return a.split("=", 1)[1]
        if a in ("--config-dir", "-cd") and i + 1 < len(argv):
            return argv[i + 1]
    return None


def input_problems(argv: list[str]) -> list[str]:
    """What Hydra would report with a traceback or without naming the culprit: an override it cannot
    parse, a YAML file of the user's config folder that is not YAML."""
    import yaml
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    found = []
    parser = OverridesParser.create()
    previous = None
    for a in argv:
        flag, previous = previous, a
        if flag in _HYDRA_VALUE_FLAGS and (flag not in ("--info", "-i") or a in _HYDRA_INFO):
            continue  # a flag's value (--cfg job): Hydra reads those
        if not a.startswith(("-", "~", "+")) and "=" not in a:
            found.append(f"error: {a!r} is neither an override (key=value) nor a script (no file {a!r} here)\n"
                         f"    hint: run [overrides] -- train.py [its arguments]; `run --help` lists the groups")
            continue
        if a.startswith("-") or not ("=" in a or a.startswith("~")):
            continue  # a flag: Hydra reads those
        try:
            parser.parse_overrides([a])
        except OverrideParseException as e:
            key = a.split("=", 1)[0]
            found.append(f"error: {key}: the override {a!r} does not parse: {e.message.splitlines()[0]}\n"
                         f"    hint: quote a value with spaces or special characters (key='a b;c'); lists are [a,b], "
                         f"mappings {{k: v}}")
    folder = _config_dir(argv)
    if folder and Path(folder).is_dir():
        for path in sorted(Path(folder).rglob("*.yaml")):
            try:
                yaml.safe_load(path.read_text())
            except yaml.YAMLError as e:
                mark = getattr(e, "problem_mark", None)
                where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
                what = getattr(e, "problem", None) or str(e).splitlines()[0]
                found.append(f"error: {where}: not valid YAML: {what}\n    hint: check the brackets, quotes and "
                             f"indentation there")
    return found


def _hydra_quoted(text: str) -> str:
    """``text`` as a quoted value of Hydra's override grammar that composes back to exactly ``text``:
    backslashes are literal except before a quote or at the end (doubled there), quotes are escaped, and
    ``${`` is escaped for OmegaConf (no interpolation)."""
    text = text.replace("${", "\\${")
    out, backslashes = [], 0
    for ch in text:
        if ch == "\\":
            backslashes += 1
            continue
        out.append("\\" * (2 * backslashes) + "\\'" if ch == "'" else "\\" * backslashes + ch)
        backslashes = 0
    return "'" + "".join(out) + "\\" * (2 * backslashes) + "'"


class ScriptArgsError(ValueError):
    pass


# Hydra's own flags that take a value (the value is not a script)
_HYDRA_VALUE_FLAGS = ("--config-dir", "-cd", "--config-name", "-cn", "--config-path", "-cp", "--cfg", "-c",
                      "--package", "-p", "--info", "-i", "--experimental-rerun", "--shell-completion", "-sc")
_HYDRA_INFO = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")  # --info's optional value
# torchrun's options, and what they are here
_TORCHRUN_FLAGS = {
    "nproc-per-node": "topology=1x{v} (or topology.devices_per_node={v})",
    "nproc_per_node": "topology=1x{v} (or topology.devices_per_node={v})",
    "nnodes": "topology.nodes={v}",
    "node-rank": "launcher=manual launcher.manual.host={v}", "node_rank": "launcher=manual launcher.manual.host={v}",
    "master-addr": "init.master_addr={v}", "master_addr": "init.master_addr={v}",
    "master-port": "init.master_port={v}", "master_port": "init.master_port={v}",
    "max-restarts": "launcher.max_restarts={v}", "max_restarts": "launcher.max_restarts={v}",
    "standalone": "nothing: one host with a store on a free port is what `run` does by default",
    "rdzv-backend": "init=tcp or init=env (the runner's rendezvous)", "rdzv_backend": "init=tcp or init=env",
    "rdzv-endpoint": "init.master_addr=HOST init.master_port=PORT", "rdzv_endpoint": "init.master_addr=HOST init.master_port=PORT",
    "no-python": "nothing: the script runs in the interpreter `run` runs in", "module": "`-- -m pkg.module`",
}


def _script_start(argv: list[str]) -> int | None:
    """Where the script begins in ``argv``, torchrun-style, without ``--``: the first argument that is neither a
    flag, a flag's value nor an override (``key=value``, ``~key``, ``+key=...``) and names a Python file
    (``train.py``, or a file that exists)."""
    skip = False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a in _HYDRA_VALUE_FLAGS:
            skip = True
            continue
        if a.startswith(("-", "~", "+")) or "=" in a:
            continue
        if a.endswith(".py") or os.path.isfile(a):
            return i
    return None


def _torchrun_flag(argv: list[str]) -> str | None:
    """A torchrun option among `run`'s own arguments, as an error that says what it is here; None: none."""
    for i, a in enumerate(argv):
        if not a.startswith("--"):
            continue
        name, _, value = a[2:].partition("=")
        if name in _TORCHRUN_FLAGS:
            if not value and name not in ("standalone", "no-python", "module") and i + 1 < len(argv):
                value = argv[i + 1]
            return (f"`{a}{' ' + value if value and '=' not in a else ''}` is torchrun's option; here: "
                    f"{_TORCHRUN_FLAGS[name].format(v=value or 'N')}; hint: run [overrides] -- train.py [its arguments]")
    return None


def script_overrides(argv: list[str]) -> list[str]:
    """``run [overrides] -- train.py --lr=0.1`` (or, as torchrun takes it, ``run [overrides] train.py --lr=0.1``;
    ``-- -m pkg.train`` for a module) as plain overrides: ``recipe=script``, ``recipe.path`` (or
    ``recipe.module``) and ``recipe.args`` (as typed, without Hydra's quoting)."""
    if "--" in argv:
        cut = argv.index("--")
        ours, script = argv[:cut], argv[cut + 1:]
    else:
        start = _script_start(argv)
        if start is None:
            if (said := _torchrun_flag(argv)) is not None:
                raise ScriptArgsError(said)
            return argv
        ours, script = argv[:start], argv[start:]
    if (said := _torchrun_flag(ours)) is not None:
        raise ScriptArgsError(said)
    if not script:
        raise ScriptArgsError("nothing follows `--`; hint: run [overrides] -- train.py [its arguments]")
    module = None
    if script[0] == "-m":
        if len(script) < 2:
            raise ScriptArgsError("`-m` names no module; hint: run [overrides] -- -m pkg.train [its arguments]")
        module, script = script[1], script[1:]
    what = f"-m {module}" if module else script[0]
    clashing = [a for a in ours if a.split("=", 1)[0].lstrip("+~") in ("recipe.path", "recipe.args", "recipe.module")
                or (a.startswith("recipe=") and a != "recipe=script")]
    if clashing:
        key = "recipe.module" if module else "recipe.path"
        raise ScriptArgsError(f"{clashing[0]!r} and `-- {what} ...` both say what to run; hint: keep one: "
                              f"`run [overrides] -- {what} ...` means recipe=script {key}={module or script[0]}")
    chosen = f"recipe.module={_hydra_quoted(module)}" if module else f"recipe.path={_hydra_quoted(script[0])}"
    return [*ours, "recipe=script", chosen, "recipe.args=[" + ",".join(_hydra_quoted(a) for a in script[1:]) + "]"]


def main(agent: LaunchAgent | None = None) -> None:
    """Console entry point (after runner.app.start, which may have started the launch ``agent``). Three forms are not
    jobs: ``run --version`` (this runner's and torch's versions: the ssh launch asks every host), ``run --reach
    <address> <port> <node rank>`` (whether this host reaches host 0's rendezvous: runner.worker.reach) and ``run
    --ssh-host <node rank> <run folder>`` (one host's share of a launcher=ssh job, started over ssh:
    runner.app.ssh_host)."""
    if agent is not None and (sys.argv[1:] == ["--version"] or sys.argv[1:2] in (["--ssh-host"], ["--reach"])):
        agent.dismiss()
        agent = None
    if sys.argv[1:] == ["--version"]:
        print(versions.installed().line(), flush=True)
        os._exit(exits.OK)
    if sys.argv[1:2] == ["--reach"]:
        from runner.worker.reach import main as reach_check

        os._exit(reach_check(sys.argv[2:]))
    if sys.argv[1:2] == ["--ssh-host"]:
        from runner.app.ssh_host import main as ssh_host

        ssh_host(sys.argv[2:])
    try:
        sys.argv[1:] = script_overrides(sys.argv[1:])
    except ScriptArgsError as e:
        if agent is not None:
            agent.dismiss()
        print(f"error: {e}", file=sys.stderr)
        sys.exit(exits.INVALID)
    problems = input_problems(sys.argv[1:])
    if problems:
        if agent is not None:
            agent.dismiss()
        print("\n".join(problems), file=sys.stderr)
        print("\nnothing was started.", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exits.INVALID)
    register(sys.argv[1:])
    task = JobTask(ProcessEnvironment.read(), agent)
    # The user's modules are imported from the job's folder by the ranks, and tried by validation in a
    # child process (runner.spec.targets); `run` itself never puts that folder on its path, so nothing there
    # (a runner.py, a hydra/ folder) can shadow what `run` imports.
    code = 0
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
            code = exits.INVALID
    codes = [ended.code for ended in task.sweep.exits()]
    stopped = task.sweep.stopped()
    if code == 0 and stopped:
        code = stopped
        print(f"\nthe sweep was stopped ({signal.Signals(exits.signal_of(code)).name}) after {len(codes)} job(s)",
              file=sys.stderr)
    elif code == 0 and any(codes):
        failed = sum(1 for c in codes if c)
        print(f"\n{failed} of {len(codes)} job(s) of the sweep failed (see the summary)", file=sys.stderr)
        code = exits.FAILED
    if task.agent is not None:
        task.agent.cancel()
    task.close()
    # Everything is written and closed: skip the interpreter's teardown (over half a second with torch
    # loaded), as the ranks do.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
