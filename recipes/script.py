"""Run an unchanged torchrun-style training script.

The process already has torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...);
the script calls ``init_process_group`` itself, exactly as under torchrun.
"""

from __future__ import annotations

import os
import runpy
import sys

MANAGES_PROCESS_GROUP = True  # the runner must not initialise the process group: the script does


def main(ctx, cfg) -> None:
    path = os.path.abspath(cfg.path)
    argv, sys.argv = sys.argv, [path, *map(str, cfg.args)]
    sys.path.insert(0, os.path.dirname(path))
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            raise
    finally:
        sys.argv = argv
        sys.path.remove(os.path.dirname(path))
