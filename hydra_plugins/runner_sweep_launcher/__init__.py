"""The runner's Hydra launcher for `run -m`: Hydra looks for launcher plugins in this package only.

Each job of a sweep runs in the `run` process, one after another, as Hydra's basic launcher runs them;
the jobs that would submit a Slurm batch job are prepared instead, and then go to Slurm together as job
arrays (runner.launchers.slurm.array), followed to their end. conf/job.yaml selects it.

What each job returns (its JobReturn's value) is how it ended, a runner.records.job_exits.JobExit, or an
ArrayMember to submit; a job that a signal to `run` stopped stops the sweep. The arrays' jobs get their JobExit
here, once followed, and it is recorded in their folders, where `run` and the summary read it.
"""

# (no `from __future__ import annotations`: Hydra's plugin scan runs this module outside sys.modules,
# where dataclasses cannot resolve string annotations)
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

log = logging.getLogger(__name__)


@dataclass
class RunnerSweepLauncherConf:
    _target_: str = "hydra_plugins.runner_sweep_launcher.RunnerSweepLauncher"


ConfigStore.instance().store(group="hydra/launcher", name="runner", node=RunnerSweepLauncherConf, provider="runner")


class RunnerSweepLauncher(Launcher):
    def __init__(self) -> None:
        super().__init__()
        self.config: Optional[DictConfig] = None
        self.task_function: Optional[TaskFunction] = None
        self.hydra_context: Optional[HydraContext] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from runner.launchers.slurm.array import ArrayMember, run_sweep
        from runner.records.job_exits import JobExit, record_exit

        setup_globals()
        assert self.hydra_context is not None and self.config is not None and self.task_function is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        log.info(f"Launching {len(job_overrides)} jobs")
        runs: Dict[int, JobReturn] = {}
        configs: Dict[int, str] = {}
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            if any(isinstance(ended := _value(ret), JobExit) and ended.stopped_by_run for ret in runs.values()):
                # Ctrl-C or SIGTERM stopped a job: the sweep stops with it
                log.info(f"the sweep was stopped: jobs #{idx} and on are not run")
                break
            configs[idx] = " ".join(filter_overrides(overrides))
            log.info(f"\t#{idx} : {configs[idx]}")
            sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = idx
                sweep_config.hydra.job.num = idx
            runs[idx] = run_job(hydra_context=self.hydra_context, task_function=self.task_function,
                                config=sweep_config, job_dir_key="hydra.sweep.dir",
                                job_subdir_key="hydra.sweep.subdir")
            configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        members = {idx: member for idx, ret in runs.items() if isinstance(member := _value(ret), ArrayMember)}
        if members:
            if callable(close := getattr(self.task_function, "close", None)):
                close()  # `run`'s zygote, which tried the jobs' targets, is not needed while Slurm runs them
            for idx, code in run_sweep(members, sweep_dir, configs).items():
                runs[idx].return_value = record_exit(members[idx].folder, code) if code is not None else None
        return list(runs.values())


def _value(ret: JobReturn) -> object:
    """What a job returned; None for a job that raised (its JobReturn would raise it again)."""
    return ret.return_value if ret.status is JobStatus.COMPLETED else None
