"""A torchrun-style script whose ranks get stuck as torch's gloo race leaves a rank (seen in ordinary DDP scripts):
the main thread waits, holding the GIL, for a thread named as gloo names its worker, which waits for the GIL.

``--ranks 1``: the ranks that get stuck; ``--when``: ``after-destroy`` (once its process group is destroyed: its work
is over, as in ~ProcessGroupGloo at main()'s return), ``before-destroy`` (after its last collective, before it
destroys its group), ``in-training`` (before the all-reduce the others wait in). Each rank writes ``<rank>.ready`` in
the current folder once it is about to be stuck."""

import argparse
import ctypes
from pathlib import Path

import torch
import torch.distributed as dist


def stick() -> None:
    # from pthread_create to pthread_join the main thread never lets the GIL go (calls of C functions alone: no Python
    # function, no loop between them), so the new thread waits for it from its start
    libc = ctypes.PyDLL(None)  # every call with the GIL held, as ~ProcessGroupGloo holds it while it joins its worker
    body = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(lambda _arg: None)  # Python: it needs the GIL first
    thread = ctypes.c_ulong()
    libc.pthread_create(ctypes.byref(thread), None, body, None)
    libc.pthread_setname_np(thread, b"pt_gloo_runloop")
    libc.pthread_join(thread, None)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", default="1")
    parser.add_argument("--when", default="after-destroy", choices=["after-destroy", "before-destroy", "in-training"])
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    stuck = str(rank) in args.ranks.split(",")
    total = torch.ones(1)
    dist.all_reduce(total)
    print(f"rank {rank}: sum {total.item():g}", flush=True)
    if stuck and args.when == "in-training":
        Path(f"{rank}.ready").write_text("")
        stick()
    dist.all_reduce(total)
    if stuck and args.when == "before-destroy":
        Path(f"{rank}.ready").write_text("")
        stick()
    dist.destroy_process_group()
    if stuck:
        Path(f"{rank}.ready").write_text("")
        stick()


if __name__ == "__main__":
    main()
