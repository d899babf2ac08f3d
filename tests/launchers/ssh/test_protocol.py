"""What launcher=ssh's `run` says to each host's `run` over stdin (runner.launchers.ssh.protocol): the spec, then
one message a line, and what is refused."""

from __future__ import annotations

import io
import signal

import pytest

from runner.launchers.ssh.protocol import (Beat, EndJob, PassSignal, ProtocolError, beat_message, end_message, parse,
                                          read_spec, signal_message, spec_message)
from runner.spec.document import load_spec_text, spec_yaml
from ssh_fixtures import ssh_launcher

pytestmark = pytest.mark.unit


def test_the_spec_goes_over_stdin_and_comes_back_equal_then_the_messages(tmp_path) -> None:
    spec = ssh_launcher(tmp_path, "+recipe.note='héllo 🙂'").plan.job.spec
    stream = io.BytesIO(spec_message(spec_yaml(spec)) + signal_message(signal.SIGINT)
                        + end_message("b", "lost: ssh exited 255"))
    assert load_spec_text(read_spec(stream)) == spec
    assert parse(stream.readline()) == PassSignal(signum=signal.SIGINT)
    end = parse(stream.readline())
    assert isinstance(end, EndJob) and (end.failure.rank, end.failure.host, end.failure.text) == (
        None, "b", "lost: ssh exited 255")
    assert stream.readline() == b""  # then stdin ends: the host stops as on SIGTERM
    assert parse(beat_message()) == Beat()
    assert parse(b"not json\n") is None and parse(b"[1]\n") is None and parse(b'{"end": {"text": 1}}\n') is None


def test_anything_else_on_stdin_is_refused_with_why() -> None:
    with pytest.raises(ProtocolError, match="spec's length in bytes"):
        read_spec(io.BytesIO(b"defaults: []\n"))
    with pytest.raises(ProtocolError, match="after 3 of the spec's 10 bytes"):
        read_spec(io.BytesIO(b"10\nabc"))


# -------------------------------------------------------------------------- what a host reports back


def test_a_hosts_reports_are_lines_of_its_stderr_that_come_back_equal() -> None:
    from runner.worker.agent_reports import REPORT, Alive, AttemptBegan, StepReached, parse_report, report_line

    began, step = AttemptBegan(attempt=2, at=1700.5), StepReached(attempt=2, step=41, resumed=30, at=1701.25)
    alive = Alive(at=1702.0, host=2)  # a Slurm task's, which names its host (srun's output does not)
    for report in (began, step, alive, StepReached(attempt=0, step=1, resumed=None, at=3.0, host=1)):
        line = report_line(report)
        assert line.startswith(REPORT) and line.endswith(b"\n") and line.count(b"\n") == 1
        assert parse_report(line) == report
    assert parse_report(b"[rank 0] step 41\n") is None
    assert parse_report(REPORT + b"{not json}\n") is None
    assert parse_report(REPORT + b'{"k": "attempt", "attempt": 1}\n') is None  # a field missing
    assert parse_report(REPORT + b'{"k": "other", "attempt": 1, "at": 1.0}\n') is None
