"""Which Hydra launcher runs the jobs of `run -m`: ours (conf/job.yaml: one job after another here, Slurm batch
jobs as job arrays) or Hydra's basic one. Another is checked before the sweep starts (a Hydra callback,
registered in conf/job.yaml), because what a job does inside it cannot be seen from `run`.

Hydra's submitit launcher (hydra-submitit-launcher: ``hydra/launcher=submitit_slurm`` or ``submitit_local``) is
refused; tried on the test cluster, it cannot run `run`'s jobs soundly:

* a job that ends without writing submitit's result (a refused spec, a kill, the OOM killer, a lost node) leaves
  `run` waiting forever where Slurm keeps no accounting (submitit asks sacct only);
* the jobs' exit statuses stay in the Slurm jobs: `run` exits 0 with failed jobs;
* with several nodes submitit starts one `run` per Slurm task, each launching the whole job.

(Each job also restored Hydra's state in the Slurm job and failed there before its spec was read, while the runner
replaced Hydra's pkg:// config source; it no longer does, so that is no reason given.) The runner's own Slurm sweep (``run -m ... launcher=slurm``) does what users reach for submitit for.
"""

from __future__ import annotations

import sys
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from runner.common import exits
from runner.spec.problems import Problem, Severity

LAUNCHER = "hydra_plugins.runner_sweep_launcher.RunnerSweepLauncher"  # conf/job.yaml's hydra/launcher

SUBMITIT_REASONS = (
    "a job that ends without submitit's result (a refused spec, a kill, the OOM killer) leaves `run` waiting forever "
    "where Slurm keeps no accounting (submitit asks sacct only); the jobs' exit statuses never reach `run`; and "
    "with several nodes it starts one `run` per Slurm task")
SLURM_SWEEP_HINT = ("run -m ... launcher=slurm sends the sweep's jobs to Slurm as job arrays, follows them to the "
                    "end (sacct, or scontrol without accounting), and writes the summary and plot; "
                    "launcher.slurm.array_parallelism=N caps how many run at once (README: Sweeps)")


def basic_launcher_target() -> str | None:
    """The ``_target_`` of Hydra's own basic launcher (hydra/launcher=basic), as Hydra registers it in its
    ConfigStore once its plugins are loaded; None before. (Its class lives in Hydra's internals: read, not named.)"""
    from hydra.core.config_store import ConfigStore
    from hydra.core.plugins import Plugins

    Plugins.instance()  # loads Hydra's core plugins, which register their configs
    try:
        node = ConfigStore.instance().load("hydra/launcher/basic.yaml").node
    except OSError:  # hydra.plugins.config_source.ConfigLoadError: not registered
        return None
    return str(node.get("_target_")) if node.get("_target_") else None


def launcher_problem(target: str, name: str) -> Problem | None:
    """Why the Hydra launcher ``target`` (chosen as hydra/launcher=``name``) cannot run a sweep of `run`, and what
    to do instead (an error), or that it was never tried with `run` (a warning); None: it can."""
    if "hydra_submitit_launcher" in target:
        return Problem(f"hydra/launcher={name}", f"Hydra's submitit launcher cannot run `run`'s jobs soundly: "
                       f"{SUBMITIT_REASONS}", SLURM_SWEEP_HINT)
    if target not in (LAUNCHER, basic_launcher_target()):
        return Problem(f"hydra/launcher={name}", "not a launcher the runner was tried with (runner, basic): each job "
                       "runs `run` wherever that launcher runs it, and the summary reads the jobs' folders",
                       severity=Severity.warning)
    return None


class SweepLauncherCheck(Callback):
    """Before a multirun starts: refuse a Hydra launcher that cannot run `run`'s jobs; nothing is submitted."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        target = str(config.hydra.launcher.get("_target_", ""))
        name = str(config.hydra.runtime.choices.get("hydra/launcher", target))
        problem = launcher_problem(target, name)
        if problem is None:
            return
        print(problem.render(), file=sys.stderr, flush=True)
        if problem.severity is Severity.error:
            print("\nnothing was started.", file=sys.stderr, flush=True)
            sys.exit(exits.INVALID)
