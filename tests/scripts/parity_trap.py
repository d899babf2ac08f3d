"""Traps SIGTERM to checkpoint and exit 0, as training scripts do, for the torchrun parity suite: each rank says it
is ready (<dir>/ready<r>) and waits; on SIGTERM it writes <dir>/stopped<r> and exits."""

import os
import signal
import sys
import time

import torch.distributed as dist

folder = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()


def stop(signum, _frame):
    open(os.path.join(folder, f"stopped{rank}"), "w").close()
    sys.exit(0)


signal.signal(signal.SIGTERM, stop)
open(os.path.join(folder, f"ready{rank}"), "w").close()
time.sleep(300)
