"""runner.training.output: a rank's events to its host agent, as JSON lines on a pipe (a real pipe, no agent)."""

from __future__ import annotations

import json
import os

import pytest

from runner.training.output import AgentChannel

pytestmark = pytest.mark.unit


@pytest.fixture
def pipe():
    """A real pipe: (read end, write end), both closed after."""
    read, write = os.pipe()
    yield read, write
    for fd in (read, write):
        try:
            os.close(fd)
        except OSError:  # closed by the test
            pass


def events(fd: int) -> list[dict]:
    """What is in the pipe now (nothing: [])."""
    os.set_blocking(fd, False)
    try:
        data = os.read(fd, 1 << 16)
    except BlockingIOError:
        return []
    return [json.loads(line) for line in data.decode().splitlines()]


def test_notes_lines_and_events_reach_the_agent_one_per_line(pipe) -> None:
    read, write = pipe
    channel = AgentChannel(write, live_bar=True)
    assert channel.live_bar
    channel.note("interface eth1\nattempt 2")
    sink = channel.lines()
    assert sink.write("progress: step 1\nprogress: step 2\n") == len("progress: step 1\nprogress: step 2\n")
    channel.send({"k": "bar", "n": 3, "text": "é"})
    assert events(read) == [{"k": "note", "text": "interface eth1"}, {"k": "note", "text": "attempt 2"},
                            {"k": "line", "text": "progress: step 1"}, {"k": "line", "text": "progress: step 2"},
                            {"k": "bar", "n": 3, "text": "é"}]


def test_a_gone_agent_disconnects_the_rank_instead_of_failing_it(pipe) -> None:
    read, write = pipe
    os.close(read)  # the agent is gone
    channel = AgentChannel(write, live_bar=False)
    channel.send({"k": "line", "text": "lost"})  # EPIPE (Python ignores SIGPIPE): no exception
    os.close(write)
    again_read, again_write = os.pipe()  # POSIX gives the lowest free numbers: the closed ones
    try:
        assert again_write == write
        channel.note("not to whatever now has the number")  # the channel let go of its descriptor at EPIPE
        assert events(again_read) == []
    finally:
        os.close(again_read)
        os.close(again_write)


def test_two_ranks_channels_are_their_own_objects(pipe) -> None:
    """No state shared through the class: one channel's descriptor and bar are not another's."""
    read, write = pipe
    other_read, other_write = os.pipe()
    try:
        mine, theirs = AgentChannel(write, live_bar=True), AgentChannel(other_write, live_bar=False)
        mine.note("mine")
        theirs.note("theirs")
        assert (mine.live_bar, theirs.live_bar) == (True, False)
        assert (events(read), events(other_read)) == ([{"k": "note", "text": "mine"}], [{"k": "note", "text": "theirs"}])
    finally:
        os.close(other_read)
        os.close(other_write)
