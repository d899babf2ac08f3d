"""runner.common.timeouts: a timeout is torch.distributed's, judged from the exception object: the texts torch 2.13
really raises (two real processes, a gloo group, a short timeout), and a recipe's own words about timeouts are not
one."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch.distributed as dist

from runner.common.timeouts import is_collective_timeout, is_timeout_text

GLOO_RECV = "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 2000ms " \
            "for recv operation to complete"
NCCL_WATCHDOG = ("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4, OpType=ALLREDUCE, "
                 "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600030 milliseconds before timing out.")


def _raised_from(cause: BaseException) -> BaseException:
    try:
        raise ValueError("the recipe's step failed") from cause
    except ValueError as e:
        return e


@pytest.mark.parametrize("exc, timeout", [
    (ValueError("timeout_s must be > 0"), False),  # a recipe's own words
    (RuntimeError("the data loader timed out"), False),
    (TimeoutError("timed out"), False),
    (dist.DistNetworkError("Connection reset by peer"), False),
    (dist.DistBackendError("NCCL error: unhandled system error"), False),
    (RuntimeError(GLOO_RECV), True),
    (RuntimeError("Application timeout caused pair closure"), True),
    (RuntimeError("Wait timeout"), True),
    (dist.DistStoreError("wait timeout after 2000ms, keys: /default_pg/0//cpu//0/0"), True),
    (dist.DistStoreError("Timed out after 3 seconds waiting for clients. 1/2 clients joined."), True),
    (dist.DistNetworkError("The client socket has timed out after 2000ms while trying to connect to (10.0.0.1, 29500)."),
     True),
    (dist.DistBackendError(NCCL_WATCHDOG), True),
    (RuntimeError(NCCL_WATCHDOG), True),
    (_raised_from(RuntimeError(GLOO_RECV)), True),
    (_raised_from(ValueError("timeout")), False),
])
def test_a_timeout_is_one_torch_distributed_raised(exc, timeout) -> None:
    assert is_collective_timeout(exc) is timeout


@pytest.mark.parametrize("text, timeout", [
    ("RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms for recv", True),
    ("DistStoreError: Timed out after 301 seconds waiting for clients", True),
    ("torch.distributed.DistBackendError: NCCL watchdog: Timeout(ms)=600000", True),
    ("RuntimeError: Connection reset by peer", False),
])
def test_timeouts_as_backends_word_them(text, timeout) -> None:
    assert is_timeout_text(text) is timeout


RANK = r'''
import datetime, json, os, sys
import torch, torch.distributed as dist
from runner.common.timeouts import is_collective_timeout, is_timeout_text

rank, folder = int(sys.argv[1]), sys.argv[2]
verdicts = os.path.join(folder, "verdicts.json")
dist.init_process_group("gloo", init_method=f"file://{folder}/group", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=1))
if rank == 1:  # never enters the all-reduce; leaves when the test closes its stdin (rank 0 has ended)
    sys.stdin.read()
    os._exit(0)
found = {}
def judge(name, call):
    try:
        call()
    except Exception as e:
        found[name] = [type(e).__name__, str(e), is_collective_timeout(e)]
judge("all_reduce", lambda: dist.all_reduce(torch.ones(1)))
judge("file store", lambda: dist.FileStore(f"{folder}/alone", 2).wait(["k"], datetime.timedelta(seconds=1)))
served = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=1), wait_for_workers=False)
judge("tcp store wait", lambda: dist.TCPStore("127.0.0.1", served.port, None, False,
                                              datetime.timedelta(seconds=1)).wait(["k"]))
with open(verdicts + ".tmp", "w") as f:
    json.dump(found, f)
os.replace(verdicts + ".tmp", verdicts)
os._exit(0)
'''


def test_the_timeouts_gloo_and_the_stores_raise_are_recognised(tmp_path) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r), str(tmp_path)], stdin=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    errs = [p.communicate(timeout=120)[1] for p in procs]  # rank 0 first: rank 1 waits for its stdin to close
    assert [p.returncode for p in procs] == [0, 0], errs
    found = json.loads((tmp_path / "verdicts.json").read_text())
    assert found["all_reduce"][0] == "RuntimeError" and "Timed out waiting 1000ms for recv operation" in found["all_reduce"][1]
    assert found["file store"][:2] == ["RuntimeError", "Wait timeout"]
    assert found["tcp store wait"][:2] == ["DistStoreError", "wait timeout after 1000ms, keys: /k"]
    assert {name: verdict[2] for name, verdict in found.items()} == {"all_reduce": True, "file store": True,
                                                                    "tcp store wait": True}
