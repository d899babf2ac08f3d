"""Run an unchanged torchrun-style training script.

The process already has torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...);
the script calls ``init_process_group`` itself, exactly as under torchrun (its config says
``init_process_group: false``, so the runner makes none; a group the script makes without a timeout
gets init.timeout_s). With ``recipe.local_rank_arg`` it also gets ``--local_rank=<local rank>`` (or
``--local-rank=``), as torch.distributed.launch passed it.
"""

from __future__ import annotations

import collections
import io
import os
import runpy
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from runner.api import RunContext


class ScriptExit(Exception):
    """The script called sys.exit with a failure status (argparse does, on arguments it refuses)."""


class _LastLines(io.TextIOBase):
    """A stream that passes everything on and keeps the last lines, to say why a script exited."""

    def __init__(self, stream, keep: int = 5) -> None:
        self._stream = stream
        self.lines: collections.deque[str] = collections.deque(maxlen=keep)

    def write(self, text: str) -> int:
        self.lines.extend(line for line in text.splitlines() if line.strip())
        return self._stream.write(text)

    def flush(self) -> None:
        self._stream.flush()


def main(ctx: RunContext, cfg: DictConfig) -> None:
    path = os.path.abspath(cfg.path)
    args = [*map(str, cfg.args)]
    if cfg.get("local_rank_arg"):
        args.append(f"{cfg.local_rank_arg}={ctx.local_rank}")
    argv, sys.argv = sys.argv, [path, *args]
    sys.path.insert(0, os.path.dirname(path))
    stderr = sys.stderr = _LastLines(sys.stderr)
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            said = " | ".join(stderr.lines)
            flag = next((f for f in ("--local_rank", "--local-rank") if f in said and "required" in said), None)
            hint = f" (hint: recipe.local_rank_arg={flag} passes it, as torch.distributed.launch did)" if flag else ""
            raise ScriptExit(f"{cfg.path} exited with status {e.code}" + (f": {said}" if said else "") + hint) from e
    finally:
        sys.stderr = stderr._stream
        sys.argv = argv
        sys.path.remove(os.path.dirname(path))
