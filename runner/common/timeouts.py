"""Whether an error is a timeout of torch.distributed (a collective, the rendezvous, the store).

The verdict is taken where the exception object is at hand, in the rank (runner.worker.setup writes it into the
rank's error record, runner.records.outcomes), from what raised it: a recipe's own ``ValueError("timeout_s must be
> 0")`` is not a hang. The texts below are torch 2.13's (gloo, NCCL and the c10d stores, as they raise them);
:func:`is_timeout_text` is only for error records written before the verdict was recorded.
"""

from __future__ import annotations

import re
import sys

# gloo and the FileStore raise a plain RuntimeError, so for those the words must be torch's own
_TORCH_TIMEOUT = re.compile(
    r"Timed out waiting \d+ms for \w+ operation"  # gloo: a collective's send or recv
    r"|Application timeout caused pair closure"  # gloo: the next collective after one timed out
    r"|^Wait timeout\b"  # FileStore (init=file): the process group did not form
    r"|wait timeout after \d+ms"  # TCPStore (env://, tcp://): the process group did not form
    r"|Timed out after \d+ seconds waiting for clients"  # the TCPStore's server
    r"|Timed out initializing process group in store based barrier"
    r"|timed out in monitoredBarrier"
    r"|Watchdog caught collective operation timeout"  # NCCL's watchdog (TORCH_NCCL_BLOCKING_WAIT raises it)
    r"|Socket Timeout")  # torch.distributed.elastic's store


def is_collective_timeout(exc: BaseException) -> bool:
    """``exc``, or an exception it was raised from, is torch.distributed timing out: a ``DistError`` (backend,
    store, network) that says it timed out, or a RuntimeError with the words gloo, NCCL or a store use for one."""
    dist = sys.modules.get("torch.distributed")  # not imported: nothing can have raised its errors
    dist_error = getattr(dist, "DistError", None)
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if dist_error is not None and isinstance(e, dist_error) and is_timeout_text(str(e)):
            return True
        if isinstance(e, RuntimeError) and _TORCH_TIMEOUT.search(str(e)):
            return True
        e = e.__cause__
    return False


def is_timeout_text(text: str) -> bool:
    """An error's text says it timed out (the guess for a record without a verdict: an older run folder)."""
    text = text.lower()
    return "timed out" in text or "timeout" in text
