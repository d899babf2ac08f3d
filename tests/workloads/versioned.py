"""Says which version of its code ran: rank 0 writes VERSION to <out_dir>/ran<attempt>. In the first attempt,
with `edit`, it then rewrites this file in the job's folder (VERSION = 2, as a user editing the code while the job
waits in a queue) and raises; with `hold`, it waits up to that many seconds for a requeue or a stop request
instead. Later attempts return at once."""

import re
import time
from pathlib import Path

VERSION = 1


def main(ctx, cfg):
    if ctx.is_main:
        Path(cfg.out_dir, f"ran{ctx.attempt}").write_text(str(VERSION))
    if ctx.attempt > 0:
        return
    if cfg.get("edit"):
        ctx.barrier()
        if ctx.is_main:
            source = Path("workloads/versioned.py")  # in the job's folder, where every process starts
            source.write_text(re.sub(r"^VERSION = \d+", "VERSION = 2", source.read_text(), flags=re.M))
        raise RuntimeError("the first attempt fails after the edit")
    deadline = time.monotonic() + cfg.get("hold", 0)
    while time.monotonic() < deadline and not ctx.should_stop():
        time.sleep(0.2)
