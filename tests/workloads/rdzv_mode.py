"""Rank 0 records the permissions of the run's rendezvous folder (init=file, in the run folder)."""

import json
import stat
from pathlib import Path


def main(ctx, cfg):
    if ctx.rank == 0:
        (folder,) = ctx.output_dir.glob("*.rdzv")
        mode = oct(stat.S_IMODE(folder.stat().st_mode))
        Path(cfg.out_dir, "mode.json").write_text(json.dumps({"folder_mode": mode}))
    ctx.barrier()
