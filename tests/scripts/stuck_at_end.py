"""A torchrun-style script whose rank ``--rank`` ends as torch's gloo race leaves a rank (seen in ordinary DDP scripts):
after its work, its main thread waits, holding the GIL, for a thread named as gloo names its worker that waits for
the GIL. ``--before-destroy``: stuck before it destroys its process group (its work is not over by its own account)."""

import argparse
import ctypes

import torch
import torch.distributed as dist


def stick() -> None:
    libc = ctypes.PyDLL(None)  # every call with the GIL held, as ~ProcessGroupGloo holds it while it joins its worker
    body = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(lambda _arg: None)  # Python: it needs the GIL first
    thread = ctypes.c_ulong()
    libc.pthread_create(ctypes.byref(thread), None, body, None)
    libc.pthread_setname_np(thread, b"pt_gloo_runloop")
    libc.pthread_join(thread, None)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--before-destroy", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    total = torch.ones(1)
    dist.all_reduce(total)
    print(f"rank {dist.get_rank()}: sum {total.item():g}", flush=True)
    stuck = dist.get_rank() == args.rank
    if stuck and args.before_destroy:
        stick()
    dist.destroy_process_group()
    if stuck:
        stick()


if __name__ == "__main__":
    main()
