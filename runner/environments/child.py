"""The environment of one process the runner starts: built here, in one function, from the plan and what
the launch decided; nowhere else."""

from __future__ import annotations

from collections.abc import Mapping

from runner.environments.process import ProcessEnvironment
from runner.plan.processes import Plan
from runner.records.paths import RunPaths
from runner.spec.place import RankPlace


def child_environment(plan: Plan, place: RankPlace, paths: RunPaths, parent: ProcessEnvironment, *,
                      master_port: str, agent_store: bool, network: Mapping[str, str] = {},
                      tmpdir: str | None = None) -> dict[str, str]:
    """Every variable the process gets beyond its parent's: torchrun's (from the plan, with the launch's
    ``master_port``), the run's attempt and the restarts allowed (launcher.max_restarts), ``agent_store`` (this
    host's agent serves the rendezvous store, as torchrun's agent does), the interface the host uses (``network``:
    runner.worker.network), the process's threads (its share of the CPUs this process may use, unless the user set
    OMP_NUM_THREADS), where torch elastic's ``@record`` writes a failure, how many collectives torch's flight
    recorder keeps (log.collectives, for a hang's diagnosis: runner.worker.watch), and its temp folder (``tmpdir``,
    as TMPDIR: the attempt's scratch folder, removed after it: runner.records.paths.RunPaths.scratch)."""
    env = plan.env(place)
    env.update(MASTER_PORT=master_port, TORCHELASTIC_RUN_ID=paths.run_id,
               TORCHELASTIC_RESTART_COUNT=str(paths.attempt),
               TORCHELASTIC_MAX_RESTARTS=str(plan.job.spec.launcher.max_restarts),
               TORCHELASTIC_ERROR_FILE=str(paths.rank(place.global_rank).elastic_error))
    if parent.nccl_async_error_handling is None:  # as torchrun's agent: on, unless the user said otherwise
        env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
    if agent_store:
        env["TORCHELASTIC_USE_AGENT_STORE"] = "True"
    env.update(network)
    env["OMP_NUM_THREADS"] = parent.omp_num_threads or str(max(1, parent.cpu_count // place.local_world_size))
    collectives = plan.job.spec.log.collectives
    if parent.flight_recorder is None and collectives:
        env["TORCH_FR_BUFFER_SIZE"] = str(collectives)
    if tmpdir is not None:
        env["TMPDIR"] = tmpdir
    return env
