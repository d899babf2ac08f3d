"""A torchrun-style script in which rank 1 issues another collective than the others at the 6th."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(4)
for _ in range(5):
    dist.all_reduce(t)
if dist.get_rank() == 1:
    dist.broadcast(t, 0)
else:
    dist.all_reduce(torch.ones(2, 3))
dist.barrier()
