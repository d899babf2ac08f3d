"""A torchrun-style script that asks its GPU for far more memory than it has: torch.OutOfMemoryError in the rank."""

import torch

if __name__ == "__main__":
    total = torch.cuda.get_device_properties(0).total_memory
    torch.empty(4 * total, dtype=torch.uint8, device="cuda")  # four times the GPU's memory
