"""Traps SIGTERM to checkpoint and exit 0, as training scripts do, for the torchrun parity suite: each rank says it
is ready (<dir>/ready<r>) and waits; on SIGTERM it writes <dir>/stopped<r> and exits.

It waits in short sleeps, as a training loop works in steps: Python runs a handler in the main thread, and a
signal the kernel hands to another thread (gloo's, here) does not cut a long ``time.sleep`` short, so one long
sleep would leave the handler waiting for it to end, under torchrun and `run` alike."""

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
for _ in range(3000):
    time.sleep(0.1)
