"""A torchrun-style script on one GPU: writes to OUT (argv[1]) what a fresh process's CUDA state would be (the CUDA
generator's initial seed and first draws) and, for each ancestor process up to `run`, whether it initialised CUDA:
the zygote and the launch agent must never have. ``--fresh`` prints the generator's part as a fresh `python` sees it.

What shows from outside that a process initialised CUDA (:func:`cuda_signs`): the driver's unified-memory device
/dev/nvidia-uvm open (cuInit opens it; NVML, which counts GPUs without initialising CUDA, does not) and the driver
library libcuda.so mapped. Not libcudart: a CUDA build of torch maps the runtime library on import, and the zygote
imports torch. The rank reads its own signs too, after it has used CUDA: a sign it does not show in itself proves
nothing about its ancestors."""

import json
import os
import sys
from collections.abc import Iterable

import psutil

UVM = "/dev/nvidia-uvm"


def generator() -> dict:
    import torch  # here: the record's checks (zygote_or_agent_initialised) are read without torch

    return {"cuda_initial_seed": torch.cuda.initial_seed(), "draws": torch.rand(4, device="cuda").tolist()}


def driver_mapped(maps: Iterable[str]) -> bool:
    """Whether lines of /proc/<pid>/maps map the CUDA driver library (libcuda.so.1), not merely the runtime."""
    return any(line.rstrip().rsplit("/", 1)[-1].startswith("libcuda.so") for line in maps)


def cuda_signs(pid: int | str = "self") -> dict:
    """{"uvm": /dev/nvidia-uvm open, "libcuda": the driver library mapped} of one process."""
    with open(f"/proc/{pid}/maps") as f:
        libcuda = driver_mapped(f)
    return {"uvm": any(_opened(f"/proc/{pid}/fd/{fd}") == UVM for fd in os.listdir(f"/proc/{pid}/fd")),
            "libcuda": libcuda}


def _opened(fd_link: str) -> str:
    try:
        return os.readlink(fd_link)
    except OSError:  # closed meanwhile
        return ""


def zygote_or_agent_initialised(record: dict) -> str | None:
    """What is wrong where the rank's parent (the zygote) or grandparent (the launch agent) initialised CUDA, else
    None. Judged by the sharpest sign the rank shows in itself: /dev/nvidia-uvm open, else libcuda mapped."""
    sign = next((s for s in ("uvm", "libcuda") if record["self"][s]), None)
    if sign is None:
        return (f"the rank shows no sign of CUDA in itself after using it ({record['self']}): its ancestors' signs "
                f"cannot be read")
    seen = [a for a in record["ancestors"][:2] if a[sign]]
    if not seen:
        return None
    return f"{'/dev/nvidia-uvm open' if sign == 'uvm' else 'libcuda mapped'} in the zygote or the agent: {seen}"


def ancestors() -> list[dict]:
    out = []
    for proc in psutil.Process().parents():
        try:
            out.append({"pid": proc.pid, "cmdline": " ".join(proc.cmdline())[:200], **cuda_signs(proc.pid)})
        except (OSError, psutil.Error):  # another user's process (init): the ones that matter are below it
            break
    return out


if __name__ == "__main__":
    if sys.argv[1] == "--fresh":
        print(json.dumps(generator()))
    else:
        ancestry = ancestors()  # before this process touches CUDA
        record = {**generator(), "ancestors": ancestry, "self": cuda_signs(),
                  "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}
        with open(sys.argv[1], "w") as f:
            json.dump(record, f)
