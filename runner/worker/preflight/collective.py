"""Preflight in every process: one all-reduce with the exact spec (runner.worker.preflight). How a host's preflight
ended is its agent's to say (runner.worker.preflight.outcome)."""

from __future__ import annotations

import datetime
import threading
import time
from dataclasses import replace

from runner.common.timeouts import is_collective_timeout
from runner.worker.preflight.checks import DEADLINE_GRACE_S, Check, HostChecks, PreflightFailed, collective_timeout_s
from runner.worker.setup import RankSetup



def _explain(e: BaseException, setup: RankSetup, timeout_s: float) -> Check:
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    text = (f"{type(e).__name__}: {first}" if first else type(e).__name__)[:300]  # a bare exception: its name, as Python
    lowered = str(e).lower()
    if is_collective_timeout(e):
        shared = "; init=file: is init.dir shared by every host?" if setup.init_method.startswith("file://") else ""
        return Check.failed(f"the processes did not all meet within {timeout_s:.0f} s ({text})",
                            f"is every host started (each prints its own preflight line)? a firewall between the "
                            f"hosts?{shared}")
    if any(w in lowered for w in ("refused", "connect", "network", "unreachable")):
        iface = setup.env.get("GLOO_SOCKET_IFNAME") or setup.env.get("NCCL_SOCKET_IFNAME")
        on = f" (this host's processes use {iface})" if iface else ""
        return Check.failed(f"the processes could not connect to each other{on}: {text}",
                            "firewall or interface: gloo/NCCL connect the processes directly, on ports besides "
                            "init.master_port: open them between the hosts; check the interface on every host "
                            "(backend.socket_ifname)")
    return Check.failed(text, f"the traceback is in {setup.log_file}")


def _all_reduce(setup: RankSetup, device: object, timeout_s: float) -> float:
    import torch
    import torch.distributed as dist

    place = setup.place
    if getattr(device, "type", None) == "cuda":
        torch.cuda.set_device(device)  # the current device is per thread
    dist.init_process_group(setup.backend, init_method=setup.init_method, rank=place.global_rank,
                            world_size=place.world_size, timeout=datetime.timedelta(seconds=timeout_s))
    try:
        t = torch.tensor([float(place.global_rank + 1)], device=device)
        dist.all_reduce(t)
        return t.item()  # waits for the device
    finally:
        dist.destroy_process_group()


def collective(setup: RankSetup, device: object) -> None:
    """init_process_group with the exact spec, all-reduce rank + 1, check the sum, destroy the group,
    within a short deadline. The host's reporting process prints the host's line; a failure raises
    PreflightFailed with the line.

    The collective runs in a daemon thread that is given up on at the deadline: the group's timeout
    does not bound everything (gloo's connect to an address that drops packets waits for the kernel's
    SYN retries, over two minutes); the process exits without it."""
    place = setup.place
    world = place.world_size
    expected = world * (world + 1) // 2
    timeout_s = collective_timeout_s(setup.spec.init.timeout_s)
    deadline_s = timeout_s + DEADLINE_GRACE_S
    report = setup.preflight or HostChecks(f"preflight {place.host} rank {place.global_rank}")
    what = f"{setup.backend} all-reduce over {world} process(es)"
    found: dict[str, object] = {}

    def work() -> None:
        try:
            found["total"] = _all_reduce(setup, device, timeout_s)
        except Exception as e:  # noqa: BLE001 (said in the line)
            found["error"] = e

    started = time.monotonic()
    worker = threading.Thread(target=work, name="preflight-all-reduce", daemon=True)
    worker.start()
    worker.join(deadline_s)
    if worker.is_alive():
        iface = setup.env.get("GLOO_SOCKET_IFNAME") or setup.env.get("NCCL_SOCKET_IFNAME")
        on = f" (this host's processes use {iface})" if iface else ""
        raise PreflightFailed(report.add(Check.failed(
            f"{what}: not done after {deadline_s:.0f} s: the processes are still connecting to each other{on}",
            "firewall or interface: gloo/NCCL connect the processes directly, on ports besides init.master_port; a "
            "firewall that drops those packets, or an interface that does not reach the other hosts "
            "(backend.socket_ifname), make the connections hang")).line())
    if "error" in found:
        error = found["error"]
        check = _explain(error, setup, timeout_s)
        raise PreflightFailed(report.add(replace(check, failure=f"{what}: {check.failure}")).line()) from error
    total = found["total"]
    if total != expected:
        raise PreflightFailed(report.add(Check.failed(
            f"{what} summed {total:g}, not {expected} (1 + ... + {world})",
            f"backend: {setup.backend} computed a wrong sum; try another backend (backend=gloo)")).line())
    if setup.preflight is not None:  # this host's reporting process
        print(report.add(Check(f"{what} ok (sum {expected}, {time.monotonic() - started:.2f} s)")).line(), flush=True)
