"""Where each rank's output goes: one log file per rank in the run folder; rank 0 also echoes to the terminal."""

from __future__ import annotations

import os
import sys

from torch.distributed.elastic.multiprocessing.api import LogsDest, LogsSpecs

from runner.outputs import RunPaths


class RankLogs(LogsSpecs):
    """Error files where the run folder keeps them; output redirection is done by the rank itself
    (:func:`redirect_output`) so that stdout and stderr share one file per rank."""

    def __init__(self, paths: RunPaths, global_ranks: list[int]) -> None:
        super().__init__(log_dir=str(paths.logs))
        self._paths = paths
        self._ranks = global_ranks

    @property
    def root_log_dir(self) -> str:
        return str(self._paths.logs)

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        none = {i: "" for i in envs}
        errors = {}
        for i in envs:
            errors[i] = str(self._paths.logs / f"rank{self._ranks[i]:05d}.elastic-error.json")
            envs[i]["TORCHELASTIC_ERROR_FILE"] = errors[i]
        return LogsDest(stdouts=none, stderrs=dict(none), tee_stdouts={}, tee_stderrs={}, error_files=errors)


class _Tee:
    """A text stream writing to two streams (the terminal and the rank's log)."""

    def __init__(self, *streams) -> None:
        self._streams = streams

    def write(self, s: str) -> int:
        for st in self._streams:
            st.write(s)
        return len(s)

    def flush(self) -> None:
        for st in self._streams:
            st.flush()

    def isatty(self) -> bool:
        return self._streams[0].isatty()

    def fileno(self) -> int:
        return self._streams[1].fileno()


def redirect_output(log_path: str, echo: bool) -> None:
    """Send this process's stdout and stderr (Python and C level) to its log; with ``echo``,
    Python-level stdout also still reaches the terminal."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    terminal = os.dup(1)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    log = os.fdopen(os.dup(1), "w", buffering=1)
    if echo:
        sys.stdout = _Tee(os.fdopen(terminal, "w", buffering=1), log)
    else:
        os.close(terminal)
        sys.stdout = log
    sys.stderr = os.fdopen(os.dup(2), "w", buffering=1)
