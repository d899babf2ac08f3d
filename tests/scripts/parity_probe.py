"""What a script sees of its process, for the torchrun parity suite (tests/e2e/test_torchrun_parity.py): run it
under torchrun and under `run`; each rank writes <out>/rank<r>.json and says one line of each kind on the terminal."""

import atexit
import faulthandler
import gc
import json
import logging
import os
import random
import subprocess
import sys
import threading
import warnings

faulthandler.enable()  # libraries do this at import: it needs a real stderr (a file descriptor)

import numpy  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.overrides import _get_current_function_mode_stack  # noqa: E402
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack  # noqa: E402


def stream(s) -> dict:
    return {"fileno": s.fileno(), "encoding": s.encoding, "errors": s.errors, "isatty": s.isatty(),
            "line_buffering": s.line_buffering, "write_through": s.write_through, "name": s.name,
            "buffer": type(s.buffer).__name__, "has_reconfigure": hasattr(s, "reconfigure")}


def descriptors() -> list[str]:
    """What the process has open beyond 0, 1 and 2 at its first line, by kind (pipe, socket, a file's path)."""
    kinds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed by now
            continue
        if int(fd) > 2:
            kinds.append(target.split(":")[0] if target.startswith(("pipe:", "socket:")) else target)
    return sorted(kinds)


seen = {
    "descriptors": descriptors(),
    "argv": sys.argv, "orig_argv": sys.orig_argv[1:], "cwd": os.getcwd(), "path0": sys.path[0],
    "main_file": sys.modules["__main__"].__file__, "name": __name__, "stdout": stream(sys.stdout),
    "stderr": stream(sys.stderr), "faulthandler": faulthandler.is_enabled(), "threads": torch.get_num_threads(),
    "thread_names": sorted(t.name for t in threading.enumerate()), "env": dict(os.environ),
    # what a fresh interpreter has: its own random streams, no thread-local torch state, modes or hooks, no atexit
    # function, logging handler or warning filter but its own and torch's
    "draws": [torch.initial_seed(), torch.rand(2).tolist(), numpy.random.rand(2).tolist(), random.random()],
    "str_hash": hash("parity"),
    "state": {"grad": torch.is_grad_enabled(), "inference": torch.is_inference_mode_enabled(),
              "dtype": str(torch.get_default_dtype()), "function_modes": len(_get_current_function_mode_stack()),
              "dispatch_modes": len(_get_current_dispatch_mode_stack()),
              "autocast": torch.is_autocast_enabled("cpu"), "deterministic": torch.are_deterministic_algorithms_enabled(),
              "atexit": atexit._ncallbacks(), "logging_handlers": len(logging.root.handlers),
              "warning_filters": len(warnings.filters), "flags": list(sys.flags), "gc": [gc.isenabled(), gc.get_threshold()],
              "dynamo": "torch._dynamo" in sys.modules, "cuda_initialized": torch.cuda.is_initialized(),
              "interop_threads": torch.get_num_interop_threads()},
}
sys.stdout.reconfigure(line_buffering=True)  # crashed rank 0 when its stdout was a Python object
sys.stderr.reconfigure(line_buffering=True)
dist.init_process_group("gloo")
r = dist.get_rank()
with open(os.path.join(sys.argv[1], f"rank{r}.json"), "w") as f:
    json.dump(seen, f)
print(f"[stdout] rank {r}")
print(f"[stderr] rank {r}", file=sys.stderr)
warnings.warn(f"[warning] rank {r}")
logging.warning("[logging] rank %d", r)
os.write(1, f"[c-stdout] rank {r}\n".encode())
os.write(2, f"[c-stderr] rank {r}\n".encode())
subprocess.run([sys.executable, "-c", f"print('[child] rank {r}')"], check=True)
dist.barrier()
dist.destroy_process_group()
