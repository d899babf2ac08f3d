"""A torchrun-style script on one GPU: writes to OUT (argv[1]) what a fresh process's CUDA state would be (the CUDA
generator's initial seed and first draws) and, for each ancestor process up to `run`, whether libcuda is mapped in it
(/proc/<pid>/maps): the zygote and the launch agent must never have initialised CUDA. ``--fresh`` prints the
generator's part as a fresh `python` sees it."""

import json
import os
import sys

import psutil
import torch


def generator() -> dict:
    return {"cuda_initial_seed": torch.cuda.initial_seed(), "draws": torch.rand(4, device="cuda").tolist()}


def ancestors() -> list[dict]:
    out = []
    for proc in psutil.Process().parents():
        try:
            with open(f"/proc/{proc.pid}/maps") as f:
                cuda = any("libcuda" in line for line in f)
            out.append({"pid": proc.pid, "cmdline": " ".join(proc.cmdline())[:200], "libcuda": cuda})
        except (OSError, psutil.Error):
            break
    return out


if __name__ == "__main__":
    if sys.argv[1] == "--fresh":
        print(json.dumps(generator()))
    else:
        ancestry = ancestors()  # before this process touches CUDA
        record = {**generator(), "ancestors": ancestry, "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}
        with open(sys.argv[1], "w") as f:
            json.dump(record, f)
