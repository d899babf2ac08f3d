"""A torchrun-style script: gloo all-reduces CUDA tensors, every rank on GPU 0 (run it with device=cpu backend=gloo:
the spec then lets 2 ranks share the one GPU). Rank r contributes r + 1; each rank checks the sum."""

import torch
import torch.distributed as dist

if __name__ == "__main__":
    dist.init_process_group("gloo")
    t = torch.full((1024,), float(dist.get_rank() + 1), device="cuda:0")
    dist.all_reduce(t)
    want = dist.get_world_size() * (dist.get_world_size() + 1) / 2
    assert t.device.type == "cuda" and torch.all(t == want).item(), (t[:4].tolist(), want)
    print(f"rank {dist.get_rank()}: gloo all-reduce of a CUDA tensor = {t[0].item()}", flush=True)
    dist.destroy_process_group()
