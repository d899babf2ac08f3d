"""The floor: import torch and rendezvous, nothing else (started N times by the benchmark)."""

import torch.distributed as dist

dist.init_process_group("gloo")
dist.destroy_process_group()
