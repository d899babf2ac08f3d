"""RunContext.should_stop across real processes (runner.training.context): two ranks of a gloo group, one of them asked
to stop, agree. (The rest of the context, in one process: test_context.py.)"""

from __future__ import annotations

import subprocess
import sys

AGREE = """
import sys, torch.distributed as dist
from pathlib import Path
from runner.common.signals import StopRequest
from runner.spec.place import RankPlace
from runner.spec.schema import ParallelConfig, ShardingConfig
from runner.training.context import ContextSettings, RunContext
rank, asked_at, folder = int(sys.argv[1]), [int(c) for c in sys.argv[2].split(",") if c], Path(sys.argv[3])
dist.init_process_group("gloo", init_method=f"file://{folder / 'rdzv'}", rank=rank, world_size=2)
stop = StopRequest()
place = RankPlace(global_rank=rank, local_rank=rank, node_rank=0, world_size=2, local_world_size=2, host="a",
                  device="cpu", device_ids=())
ctx = RunContext(ContextSettings(place=place, parallel=ParallelConfig(), sharding=ShardingConfig(), global_batch_size=8,
                                 seed=7, output_dir=folder, metrics_file=folder / f"m{rank}.jsonl",
                                 checkpoint_dir=folder / "ck", attempt=0, stop=stop))
said = []
for call in range(4):
    stop.requested = call in asked_at  # this rank alone is asked, from this call on
    said.append(ctx.should_stop(every=2))
print(",".join("1" if s else "0" for s in said))
dist.destroy_process_group()
"""


def test_should_stop_agrees_when_only_one_rank_was_asked(tmp_path) -> None:
    """Two real processes (gloo): rank 1 alone is asked to stop, on its 2nd call; both say True on the next call
    that agrees (every=2: the 2nd and the 4th), rank 0 without a request of its own."""
    procs = [subprocess.Popen([sys.executable, "-c", AGREE, str(rank), asked, str(tmp_path)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank, asked in ((0, ""), (1, "1,2,3"))]
    said = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], said
    assert [out.strip() for out, _ in said] == ["0,1,0,1", "0,1,0,1"]
