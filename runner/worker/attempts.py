"""How the hosts of a job started by hand on each (launcher=manual) restart together: they agree on the attempt
through host 0's rendezvous store, the one its `run` serves for the ranks (a fresh store per attempt, as torch's
agent does).

* Host 0 writes ``runner/attempt`` into each attempt's store as it opens it.
* Another host waits for the store of the attempt it is about to start, and joins a later one if the store says
  so: a host whose `run` died and was started again joins the attempt the others are in.
* A host whose processes failed writes ``runner/failed``; the others see it and end their share of the attempt,
  so that all of them start the next one together.
"""

from __future__ import annotations

import datetime
import socket
import time

from runner.plan.processes import Plan

ATTEMPT_KEY = "runner/attempt"
FAILED_KEY = "runner/failed"
POLL_S = 0.5


class AttemptError(Exception):
    """Host 0's store cannot be reached, or did not open the attempt in time."""


class Attempts:
    """This host's view of the job's attempts (host 0: the store it serves; others: a client of it)."""

    def __init__(self, plan: Plan, node_rank: int) -> None:
        self.plan = plan
        self.node_rank = node_rank
        self._store = None  # host 0: the attempt's store (served by its rendezvous); others: a client

    # -- host 0 ---------------------------------------------------------------------------------------------
    def opened(self, store: object, attempt: int) -> None:
        """Host 0 opened ``attempt``'s store: the other hosts may start it."""
        self._store = store
        store.set(ATTEMPT_KEY, str(attempt))

    # -- the other hosts ------------------------------------------------------------------------------------
    def _client(self, timeout_s: float):
        import torch.distributed as dist

        return dist.TCPStore(self.plan.master_addr, int(self.plan.master_port), None, False,
                             datetime.timedelta(seconds=timeout_s), wait_for_workers=False)

    def wait_for(self, attempt: int) -> int:
        """Host i: wait until host 0's store is the one of ``attempt`` or a later one (within init.timeout_s);
        the attempt to start."""
        deadline = time.monotonic() + self.plan.job.spec.init.timeout_s
        last_error = "nothing listens there yet"
        while time.monotonic() < deadline:
            try:  # a plain connection first: a TCPStore client that cannot connect logs each try at length
                socket.create_connection((self.plan.master_addr, int(self.plan.master_port)), timeout=2).close()
            except OSError as e:
                last_error = e.strerror or str(e)
                time.sleep(POLL_S)
                continue
            try:
                client = self._client(max(1.0, min(5.0, deadline - time.monotonic())))
                current = int(client.get(ATTEMPT_KEY))
            except (RuntimeError, ValueError) as e:  # not up yet, or the previous attempt's store going away
                last_error = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
                time.sleep(POLL_S)
                continue
            if current >= attempt:
                self._store = client
                return current
            time.sleep(POLL_S)  # the previous attempt's store, still open
        raise AttemptError(f"host 0's store at {self.plan.master_addr}:{self.plan.master_port} did not open attempt "
                           f"{attempt + 1} within init.timeout_s={self.plan.job.spec.init.timeout_s:g} s "
                           f"({last_error}); is host 0's `run` still running?")

    # -- every host -----------------------------------------------------------------------------------------
    def say_failed(self) -> None:
        """This host's share of the attempt failed: the others end theirs."""
        try:
            if self._store is not None:
                self._store.set(FAILED_KEY, str(self.node_rank))
        except RuntimeError:
            pass  # host 0's store is gone already: the others see their peers gone too

    def other_failed(self) -> bool:
        """Another host said its share of this attempt failed. (A store that went away says nothing: host 0 may
        have finished first; if it died, this host's processes lose their peers and fail by themselves.)"""
        try:
            return self._store is not None and self._store.check([FAILED_KEY])
        except RuntimeError:
            return False

    def close(self) -> None:
        """The attempt is over: let go of its store (host 0's, served here, closes with it)."""
        self._store = None
