"""A torchrun-style script: its own process group, one all-reduce, a record per rank in ./art/rank<r>.json
with the --tag it was given."""

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--tag", default="")
args = parser.parse_args()
dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
Path("art").mkdir(exist_ok=True)
Path("art", f"rank{dist.get_rank()}.json").write_text(json.dumps(
    {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "sum": total.item(), "tag": args.tag,
     "local_rank": int(os.environ["LOCAL_RANK"])}))
dist.destroy_process_group()
