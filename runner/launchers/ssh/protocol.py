"""What the ssh launch's `run` says to each host's `run` over the ssh session's stdin (runner.launchers.ssh.session
writes, runner.app.ssh_host reads), in order:

1. the run's spec.yaml, as pinned here: its length in bytes on a line, then the bytes;
2. then, one JSON object a line, as things happen: ``{"beat": true}`` every ``launcher.ssh.keepalive_s`` — this
   `run` is still there: a host that hears nothing for :data:`BEATS_MISSED` of them takes it as gone (a network
   that drops everything closes no connection); ``{"signal": N}`` — `run` here got signal N (Ctrl-C, SIGTERM, the
   stop signal): the host passes it on as if its own `run` had got it; ``{"end": {"rank": null, "host": NAME,
   "text": WHY, "time": T}}`` — the job ends: another host was lost, or its `run` ended badly; this host stops its
   share and does not restart it;
3. the end of the stream: this `run` or the connection is gone; the host stops its share as on SIGTERM.

The other way, each host's `run` says what the launching one needs to know of the job as lines of its stderr that
begin with runner.worker.agent_reports.REPORT (the launching `run` takes them out of what it shows): its host
agent's reports (an attempt began, rank 0's step), what a job that outlives its hosts records of a change
(runner.launchers.elastic.rounds).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import IO

from runner.worker.channel_records import JobFailure

from runner.launchers.elastic.liveness import BEATS_MISSED  # beats a host may miss before it takes the launching `run`
# as gone (ssh's own count, and one more)

__all__ = ["BEATS_MISSED"]


class ProtocolError(Exception):
    """What came on stdin is not what the ssh launch sends."""


def spec_message(spec_text: str) -> bytes:
    data = spec_text.encode()
    return f"{len(data)}\n".encode() + data


def read_spec(stream: IO[bytes]) -> str:
    """The spec at the start of ``stream`` (:func:`spec_message`). Raises ProtocolError."""
    head = stream.readline()
    try:
        size = int(head)
    except ValueError:
        raise ProtocolError(f"expected the spec's length in bytes on the first line of stdin, got {head[:80]!r}; "
                            f"`run --ssh-host` is started by launcher=ssh") from None
    data = stream.read(size)
    if len(data) != size:
        raise ProtocolError(f"stdin ended after {len(data)} of the spec's {size} bytes")
    return data.decode()


@dataclass(frozen=True)
class Beat:
    """The launching `run` is still there."""


@dataclass(frozen=True, kw_only=True)
class PassSignal:
    """The launching `run` got ``signum``: the host takes it as its own."""

    signum: int


@dataclass(frozen=True, kw_only=True)
class EndJob:
    """The job ends: another host was lost, or its `run` ended badly (``failure``, of no rank)."""

    failure: JobFailure


Message = Beat | PassSignal | EndJob


def beat_message() -> bytes:
    return b'{"beat": true}\n'


def signal_message(signum: int) -> bytes:
    return json.dumps({"signal": int(signum)}).encode() + b"\n"


def end_message(host: str, text: str) -> bytes:
    return json.dumps({"end": JobFailure(rank=None, host=host, text=text).document()}).encode() + b"\n"


def parse(line: bytes) -> Message | None:
    """One message after the spec (the module docstring); None for anything else (ignored)."""
    try:
        found = json.loads(line)
    except ValueError:
        return None
    if not isinstance(found, dict):
        return None
    if found.get("beat") is True:
        return Beat()
    if isinstance(found.get("signal"), int):
        return PassSignal(signum=found["signal"])
    failure = JobFailure.from_document(found.get("end"))
    return EndJob(failure=failure) if failure is not None else None
