"""What the processes of one job tell each other across hosts, without a shared run folder: the job's channel.

Every host agent of a job (runner.worker.host_agent), and every rank's watch (runner.worker.watch), reach one
place: host 0's rendezvous store (env://, tcp://: the TCPStore host 0's agent serves for the whole job, the one
the ranks rendezvous through), or, with init=file, the job's folder beside the init file (init.dir, which every
host sees by the rule of file:// init). Keys, each under ``runner/``:

* ``attempt`` — the attempt host 0 has opened (restarts across hosts: the hosts start each attempt together);
* ``failed/<attempt>`` — the first failure of an attempt, said by the host whose rank failed: every other host
  ends its share within :data:`POLL_S` and says why;
* ``stop`` — a signal that reached one host's ``run`` (Ctrl-C, SIGTERM, the stop signal): every host passes it
  on to its ranks, and ends as that host does;
* ``joined/<attempt>/<rank>`` — the rank joined the process group (a hang's report tells "did not form" from
  "formed, then stuck");
* ``dumps/request``, ``dumps/<rank>`` — a request for every rank to say where it is, and each rank's answer
  (runner.records.dumps.RankDump): a hang's paragraph names every rank of every host;
* ``ended/<attempt>/<rank>`` — how a rank ended (its outcome record, as its host agent saw it), which host 0 writes
  into its run folder: the run's summary covers every rank of every host;
* ``pairs/<attempt>/...`` — each host's part of the data-network check before the attempt's ranks start, and host
  0's verdict (runner.worker.pair_check);
* ``reported/<attempt>``, ``left/<attempt>/<agent>`` — host 0 has written every rank's record of the attempt and
  said how it ended; another host's agent has heard it and asks nothing more of the store. Under a scheduler that
  kills every task once one ends (mpirun), the other tasks wait for the first before they end theirs, and host 0's
  waits for the second (for a moment) before its store goes away.

Values are JSON. A store that has gone away (host 0 finished, or died) answers nothing: a host that loses it
learns of its peers' end from its own ranks.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from runner.common.files import write_atomically
from runner.common.polling import poll, retry
from runner.records.dumps import RankDump
from runner.records.paths import RunPaths
from runner.records.watch_files import collect_dumps, request_dumps
from runner.spec.schema import InitConfig, InitMethod
from runner.worker.channel_records import DumpRequest, JobFailure, RankEnding, StopAsked

POLL_S = 0.5  # how often a host agent looks for another host's failure or a stop request
REACH_STORE_S = 2.0  # how long a `run` tries host 0's store to reach the job's channel (channel_of): to pass a signal
# on (launcher=mpi), to ask where the ranks are (Ctrl-\\ under launcher=manual)
PREFIX = "runner/"


class KeyValue(Protocol):
    """Where the channel keeps its keys: a TCPStore, or a folder."""

    def set(self, key: str, value: bytes) -> None: ...
    def get(self, key: str) -> bytes | None: ...  # None: not there (never waits)
    def first(self, key: str, value: bytes) -> bool: ...  # set unless set already; whether this call set it


class StoreKeyValue:
    """Keys in a torch.distributed TCPStore (host 0's, served or reached)."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def set(self, key: str, value: bytes) -> None:
        self.store.set(PREFIX + key, value)

    def get(self, key: str) -> bytes | None:
        if not self.store.check([PREFIX + key]):
            return None
        return bytes(self.store.get(PREFIX + key))

    def first(self, key: str, value: bytes) -> bool:
        return bytes(self.store.compare_set(PREFIX + key, b"", value)) == value


class FolderKeyValue:
    """Keys as files of a folder every host sees (init=file's folder)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.folder / key.replace("/", "__")

    def set(self, key: str, value: bytes) -> None:
        write_atomically(self._path(key), value)

    def get(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except OSError:
            return None

    def first(self, key: str, value: bytes) -> bool:
        # written whole under a name of its own, then linked to the key's name, which fails if that is taken: a
        # reader never sees the key half written, and a writer that dies midway leaves no empty key behind
        path = self._path(key)
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(value)
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        return True


class ChannelError(Exception):
    """Host 0's store cannot be reached, or did not open an attempt in time."""


class ChannelInterrupted(ChannelError):
    """The wait for host 0's store was given up: this host's share is stopping (SIGINT, SIGTERM, the job ended)."""


class JobChannel:
    """One process's end of its job's channel (see the module docstring). Every call but :meth:`reach_attempt`
    returns at once; a channel whose store went away reads as empty."""

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    @property
    def key_value(self) -> KeyValue:
        """Where its keys are kept (runner.worker.channel_proxy serves another process's through it)."""
        return self._kv

    def close(self) -> None:
        """Let go of the store, where this end holds something of its own (a proxy's process)."""
        closing = getattr(self._kv, "close", None)
        if closing is not None:
            closing()

    # -- opening -----------------------------------------------------------------------------------------------
    @classmethod
    def served(cls, store: Any) -> JobChannel:
        """An end on a store this process holds already (a TCPStore, served or reached, or any torch Store)."""
        return cls(StoreKeyValue(store))

    @classmethod
    def reach(cls, addr: str, port: int, timeout_s: float) -> JobChannel:
        """Another process's end: a client of host 0's store at ``addr:port``, waiting up to ``timeout_s`` for it
        (host 0 may start later). Raises ChannelError."""
        import torch.distributed as dist

        deadline = time.monotonic() + timeout_s

        def connect() -> Any:
            # a plain connection first: a TCPStore client that cannot connect logs each try at length
            socket.create_connection((addr, port), timeout=2).close()
            return dist.TCPStore(addr, port, None, False, datetime.timedelta(seconds=max(1.0, min(
                30.0, deadline - time.monotonic()))), wait_for_workers=False)

        try:  # RuntimeError, ValueError: the previous attempt's store going away
            return cls(StoreKeyValue(retry(connect, (OSError, RuntimeError, ValueError), timeout_s, POLL_S)))
        except OSError as e:
            last = e.strerror or str(e)
        except (RuntimeError, ValueError) as e:
            last = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise ChannelError(f"host 0's store at {addr}:{port} cannot be reached ({last}) within {timeout_s:g} s; is "
                           f"host 0's `run` running?")

    @classmethod
    def reach_attempt(cls, addr: str, port: int, attempt: int, timeout_s: float,
                      reach: Callable[[str, int, float], JobChannel] | None = None) -> tuple[JobChannel, int]:
        """Another host's end, for the attempt it is about to start: host 0's store once it has opened ``attempt``
        or a later one (a host started again joins the attempt the others are in), and that attempt. While host 0
        moves from one attempt's store to the next, the old one answers an older attempt, then goes away: each
        look is a new connection (``reach``: how one is made; :meth:`reach` by default). Raises ChannelError."""
        deadline = time.monotonic() + timeout_s
        reach = reach or cls.reach
        previous: list[JobChannel] = []

        def look() -> tuple[JobChannel, int | None]:
            for old in previous:
                old.close()
            previous[:] = [reach(addr, port, max(1.0, deadline - time.monotonic()))]
            return previous[0], previous[0].attempt()

        channel, current = poll(look, lambda seen: seen[1] is not None and seen[1] >= attempt, timeout_s, POLL_S)
        if current is None or current < attempt:
            channel.close()
            raise ChannelError(f"host 0's store at {addr}:{port} did not open attempt {attempt + 1} within "
                               f"{timeout_s:g} s; is host 0's `run` still running?")
        return channel, current

    @classmethod
    def in_folder(cls, folder: Path) -> JobChannel:
        """The channel of an init=file job: files in ``folder``, which every host sees."""
        return cls(FolderKeyValue(folder))

    # -- values ------------------------------------------------------------------------------------------------
    def _put(self, key: str, value: Any) -> None:
        try:
            self._kv.set(key, json.dumps(value).encode())
        except (RuntimeError, OSError):
            pass  # the store is gone: nobody is left to tell

    def _read(self, key: str) -> Any:
        try:
            raw = self._kv.get(key)
        except (RuntimeError, OSError):
            return None
        if raw is None or raw == b"":
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return None

    # -- attempts (restarts across hosts) ----------------------------------------------------------------------
    def open_attempt(self, attempt: int) -> None:
        """Host 0 opened ``attempt``: the other hosts may start it."""
        self._put("attempt", attempt)

    def attempt(self) -> int | None:
        found = self._read("attempt")
        return found if isinstance(found, int) else None

    # -- failures and stops ------------------------------------------------------------------------------------
    def say_failed(self, attempt: int, failure: JobFailure) -> None:
        """The first failure of ``attempt`` (this host's rank's, or the host's own): the first said stays."""
        value = json.dumps(failure.document()).encode()
        try:
            self._kv.first(f"failed/{attempt}", value)
        except (RuntimeError, OSError):
            pass

    def failure(self, attempt: int) -> JobFailure | None:
        """The first failure of ``attempt`` any host said; None."""
        return JobFailure.from_document(self._read(f"failed/{attempt}"))

    def request_stop(self, signum: int, host: str) -> None:
        """``host``'s `run` (or agent) got ``signum``: Ctrl-C, SIGTERM or the stop request, for every host."""
        self._put("stop", StopAsked(signal=int(signum), host=host).document())

    def stop_requested(self) -> StopAsked | None:
        return StopAsked.from_document(self._read("stop"))

    def say_stop_told(self, asked: float) -> None:
        """Host 0's agent said where every rank was at a stop (its request for dumps made at ``asked``)."""
        self._put("stop/told", {"asked": asked, "time": time.time()})

    def stop_told(self) -> bool:
        return isinstance(self._read("stop/told"), dict)

    # -- the data-network check (runner.worker.pair_check) ------------------------------------------------------
    def say_pairs(self, key: str, value: Any) -> None:
        self._put(f"pairs/{key}", value)

    def pairs(self, key: str) -> Any:
        """What was said under ``pairs/<key>`` (None: nothing yet, or the store is gone)."""
        return self._read(f"pairs/{key}")

    # -- ranks -------------------------------------------------------------------------------------------------
    def say_joined(self, attempt: int, rank: int) -> None:
        self._put(f"joined/{attempt}/{rank}", True)

    def joined(self, attempt: int, ranks: range) -> list[int]:
        return [r for r in ranks if self._read(f"joined/{attempt}/{r}")]

    def request_dumps_at(self, asked: float, reason: str) -> None:
        """Ask every rank to say where it is (a request made at ``asked``)."""
        self._put("dumps/request", DumpRequest(time=asked, reason=reason).document())

    def dump_request(self) -> DumpRequest | None:
        return DumpRequest.from_document(self._read("dumps/request"))

    def put_dump(self, rank: int, document: dict[str, Any]) -> None:
        self._put(f"dumps/{rank}", document)

    def dump(self, rank: int) -> dict[str, Any] | None:
        found = self._read(f"dumps/{rank}")
        return found if isinstance(found, dict) else None

    def put_beat(self, rank: int, progressed_s: float) -> None:
        """When rank ``rank`` last completed a collective or a progress step (the stall watchdog reads them)."""
        self._put(f"beat/{rank}", progressed_s)

    def beat(self, rank: int) -> float | None:
        found = self._read(f"beat/{rank}")
        return float(found) if isinstance(found, (int, float)) else None

    # -- endings -----------------------------------------------------------------------------------------------
    def say_ended(self, attempt: int, rank: int, record: RankEnding) -> None:
        """How global rank ``rank`` ended (its outcome record, as its host agent saw it)."""
        self._put(f"ended/{attempt}/{rank}", record.document())

    def ended(self, attempt: int, rank: int) -> RankEnding | None:
        return RankEnding.from_document(self._read(f"ended/{attempt}/{rank}"))

    def say_reported(self, attempt: int) -> None:
        """Host 0 has written every rank's record of ``attempt`` and said how it ended."""
        self._put(f"reported/{attempt}", True)

    def reported(self, attempt: int) -> bool:
        """Whether host 0 has reported ``attempt``, or is gone (its store went away: nobody is left to report)."""
        try:
            return self._kv.get(f"reported/{attempt}") is not None
        except (RuntimeError, OSError):
            return True

    def say_left(self, attempt: int, agent: int) -> None:
        """The agent of global rank ``agent`` (a host's first) heard host 0's report and asks nothing more."""
        self._put(f"left/{attempt}/{agent}", True)

    def left(self, attempt: int, agents: Iterable[int]) -> list[int]:
        """Those of ``agents`` that said they left."""
        return [a for a in agents if self._read(f"left/{attempt}/{a}")]


def ask_for_dumps(paths: RunPaths, channel: JobChannel | None, reason: str) -> float:
    """Ask every rank to say where it is: through the job's channel, and the run folder's request file (ranks of a
    job without a channel, and `run` on a Slurm login node, look there); the time of the request."""
    asked = request_dumps(paths, reason)
    if channel is not None:
        channel.request_dumps_at(asked, reason)
    return asked


def gather_dumps(paths: RunPaths, channel: JobChannel | None, ranks: Iterable[int], since: float,
                 wait_s: float = 0.0) -> dict[int, RankDump]:
    """The ranks' dumps written at or after ``since``, from the channel (any host) or the run folder, waiting up to
    ``wait_s`` for the missing ones."""
    elsewhere = (lambda r: RankDump.from_document(channel.dump(r) or {})) if channel is not None else None
    return collect_dumps(paths, ranks, since, wait_s, elsewhere)


def where_through(channel: JobChannel | None) -> dict[str, Callable[..., Any]]:
    """runner.reports.where.where_the_ranks_are's ``ask`` and ``gather``, through ``channel`` and the run folder."""
    return {"ask": lambda paths, reason: ask_for_dumps(paths, channel, reason),
            "gather": lambda paths, ranks, since, wait_s: gather_dumps(paths, channel, ranks, since, wait_s)}


def channel_of(paths: RunPaths, init: InitConfig, addr: str | None, port: str | None,
               timeout_s: float) -> JobChannel | None:
    """A rank's (or a task's, or `run`'s) end of its job's channel: the folder of an init=file job (in ``init.dir``),
    else a client of host 0's store at ``addr:port``; None where the store cannot be reached (the run folder's files
    still serve)."""
    if init.method is InitMethod.file:
        return JobChannel.in_folder(paths.channel_folder(init.dir))
    if not addr or not port:
        return None
    try:
        return JobChannel.reach(addr, int(port), timeout_s)
    except (ChannelError, ValueError):
        return None
