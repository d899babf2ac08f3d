"""Ordinary DDP scripts, the shapes users write (tests/e2e/test_rank_endings.py runs each many times, and every run
must end with the script's status): ``--shape`` picks one.

* ``sgd``: DDP and SGD made in main(), 20 steps, destroy_process_group(), return (benchmarks/workloads/tiny_ddp.py);
* ``adam_kept``: Adam, and the process group left to the end of the process (no destroy_process_group());
* ``loader``: a DataLoader with 2 worker processes and a DistributedSampler, SGD, destroy;
* ``compiled``: torch.compile (backend "eager": no compiler needed) over the DDP model, SGD, destroy;
* ``dynamo_first``: imports torch._dynamo before anything else (as libraries that compile do), SGD, destroy: the shape
  that hangs at its end under torchrun too, 3 runs in 12 (torch's race in ~ProcessGroupGloo).
"""

import argparse

parser = argparse.ArgumentParser()
parser.add_argument("--shape", required=True, choices=["sgd", "adam_kept", "loader", "compiled", "dynamo_first"])
parser.add_argument("--rep", type=int, default=0)  # which repetition: the sweep's jobs differ by it alone
args = parser.parse_args()
if args.shape == "dynamo_first":
    import torch._dynamo  # noqa: F401

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset  # noqa: E402


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(32, 4))
    if args.shape == "compiled":
        model = torch.compile(model, backend="eager")
    opt = (torch.optim.Adam if args.shape == "adam_kept" else torch.optim.SGD)(model.parameters(), lr=0.01)
    if args.shape == "loader":
        data = TensorDataset(torch.randn(320, 32))
        batches = (x for (x,) in DataLoader(data, batch_size=8, num_workers=2, sampler=DistributedSampler(data)))
    else:
        batches = (torch.randn(8, 32) for _ in range(20))
    for x in batches:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    if args.shape != "adam_kept":
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
