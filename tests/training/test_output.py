"""runner.training.output: a rank's events to its agent, as JSON lines on a pipe (a real pipe, no agent)."""

from __future__ import annotations

import json
import os

import pytest

from runner.training import output

pytestmark = pytest.mark.unit


@pytest.fixture
def channel():
    """A pipe connected as a rank's channel; its read end. Disconnected after."""
    read, write = os.pipe()
    output.connect(write, live_bar=True)
    try:
        yield read
    finally:
        output._Channel.fd, output._Channel.live_bar = None, False
        os.close(write)
        os.close(read)


def events(fd: int) -> list[dict]:
    os.set_blocking(fd, False)
    return [json.loads(line) for line in os.read(fd, 1 << 16).decode().splitlines()]


def test_notes_lines_and_events_reach_the_agent_one_per_line(channel) -> None:
    assert output.connected() and output.live_bar()
    output.note("interface eth1\nattempt 2")
    assert output.LineSink().write("progress: step 1\nprogress: step 2\n") == len("progress: step 1\nprogress: step 2\n")
    output.send({"k": "bar", "n": 3, "text": "é"})
    assert events(channel) == [{"k": "note", "text": "interface eth1"}, {"k": "note", "text": "attempt 2"},
                               {"k": "line", "text": "progress: step 1"}, {"k": "line", "text": "progress: step 2"},
                               {"k": "bar", "n": 3, "text": "é"}]


def test_a_gone_agent_disconnects_the_rank_instead_of_failing_it() -> None:
    read, write = os.pipe()
    os.close(read)  # the agent is gone
    output.connect(write, live_bar=False)
    try:
        output.send({"k": "line", "text": "lost"})  # EPIPE (Python ignores SIGPIPE): no exception
        assert not output.connected()
    finally:
        output._Channel.fd = None
        os.close(write)


def test_without_an_agent_notes_go_to_stderr(capsys) -> None:
    assert not output.connected() and not output.live_bar()
    output.note("no agent here")
    output.send({"k": "line", "text": "dropped"})
    assert capsys.readouterr() == ("", "no agent here\n")
