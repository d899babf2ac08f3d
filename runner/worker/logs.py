"""Where torch elastic keeps what it writes of each rank: the rank's error file in the run folder. A rank's
output itself goes to its log by the rank's own redirection (runner.training.output), so that stdout and
stderr share one file per rank."""

from __future__ import annotations

from torch.distributed.elastic.multiprocessing.api import LogsDest, LogsSpecs

from runner.plan.paths import RunPaths


class RankLogs(LogsSpecs):
    """The run folder's logs/ for torch elastic's process context; no redirection of its own."""

    def __init__(self, paths: RunPaths, global_ranks: list[int]) -> None:
        super().__init__(log_dir=str(paths.logs))
        self._paths = paths
        self._ranks = global_ranks

    @property
    def root_log_dir(self) -> str:
        return str(self._paths.logs)

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        """Each rank's TORCHELASTIC_ERROR_FILE is in its environment already (runner.environments.child)."""
        none = {i: "" for i in envs}
        errors = {i: str(self._paths.elastic_error_file(self._ranks[i])) for i in envs}
        return LogsDest(stdouts=none, stderrs=dict(none), tee_stdouts={}, tee_stderrs={}, error_files=errors)
