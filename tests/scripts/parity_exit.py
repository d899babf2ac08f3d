"""Ends as the first argument says, for the torchrun parity suite: return, exit3 (sys.exit(3)), os_exit0, os_exit5,
raise (rank 1 raises), segv (rank 1 crashes in native code)."""

import ctypes
import os
import sys

import torch.distributed as dist

how = sys.argv[1]
dist.init_process_group("gloo")
dist.barrier()
rank = dist.get_rank()
if how == "exit3":
    sys.exit(3)
elif how == "os_exit0":
    print("finished", flush=True)
    os._exit(0)  # skipping a slow teardown, as some scripts do
elif how == "os_exit5":
    os._exit(5)
elif how == "raise" and rank == 1:
    raise ValueError("rank 1 gives up")
elif how == "segv" and rank == 1:
    ctypes.string_at(0)
