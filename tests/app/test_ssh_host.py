"""One host's share of a launcher=ssh job, `run --ssh-host <node> <run folder>` (runner.app.ssh_host), without ssh:
its stderr headed with its host, what it refuses before its agent runs (what comes on stdin is no spec, a spec that
does not load or does not validate here, a node the spec has not), what it does with the launching `run`'s messages
(a signal is its own, an end of the job goes to its agent, beats and anything else only say `run` is there), and
how it ends when the launching `run` is gone: its stdin ends, or no beat comes (SIGTERM to itself, then exit 143
after the hard stop), a signal before its agent runs, and a command line it does not take. Those that end the
process run in a forked child of this one.

The share itself, its agent running ranks and hearing the launching `run`: tests/e2e/test_ssh.py (every job there;
a host's `run` stopping by itself when its stdin ends: test_nothing_outlives_run_when_it_is_killed, when no beat
comes: test_a_host_cut_off_the_network_is_lost_after_its_keepalives_and_stops_by_itself). `run --ssh-host` with
nothing on stdin, through the real `run`: tests/app/test_cli.py."""

from __future__ import annotations

import io
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from children import CHILD_S, in_child
from conftest import environment, make_spec
from runner.app.host_entry import HolderGone, run_share
from runner.app.ssh_host import USAGE, DriverWatch, HostLabelled, SshHost, _until_agent, main
from runner.common.signals import handling
from runner.launchers.ssh.protocol import beat_message, end_message, signal_message, spec_message
from runner.spec.document import spec_yaml
from runner.worker.channel_records import JobFailure

# ------------------------------------------------------------------------------------------- its stderr


@pytest.mark.unit
def test_each_line_of_its_stderr_is_headed_with_its_host() -> None:
    """A line begun is continued without a second head; blank lines get none."""
    out = io.StringIO()
    said = HostLabelled(out, "[host b] ")
    assert said.write("SIGTERM: stopping\nhalf ") == len("SIGTERM: stopping\nhalf ")
    said.write("a line\n\nlast")
    said.write("\n  \n")
    assert out.getvalue() == "[host b] SIGTERM: stopping\n[host b] half a line\n\n[host b] last\n  \n"


@pytest.mark.unit
def test_its_stderr_is_the_same_descriptor_and_no_terminal(tmp_path) -> None:
    """The agent relays its ranks' output to the descriptor itself, unheaded (``fileno``)."""
    with open(tmp_path / "err", "w") as real:
        said = HostLabelled(real, "[host a] ")
        assert (said.fileno(), said.isatty(), said.writable()) == (real.fileno(), False, True)
        said.write("flushed\n")
        said.flush()
        assert (tmp_path / "err").read_text() == "[host a] flushed\n"


# ------------------------------------------------------------------------------------------- what it refuses


def _share(node: int, folder: Path, stdin: bytes) -> int:
    before = sys.stderr
    try:
        return run_share(SshHost(node, folder, io.BytesIO(stdin)), environment())
    finally:
        sys.stderr = before  # (run_share heads this process's stderr with its host: the process ends after it)


def _two_hosts() -> str:
    return spec_yaml(make_spec(launcher="ssh", names=["a", "b"], devices=[1, 1]))


@pytest.mark.unit
def test_stdin_that_is_not_the_launching_runs_is_refused(tmp_path, capsys) -> None:
    assert _share(0, tmp_path / "R1", b"defaults: []\n") == 2
    assert capsys.readouterr().err == ("error: expected the spec's length in bytes on the first line of stdin, got "
                                       "b'defaults: []\\n'; `run --ssh-host` is started by launcher=ssh\n")
    assert not (tmp_path / "R1").exists()


@pytest.mark.unit
def test_a_spec_that_does_not_load_is_refused_with_why(tmp_path, capsys) -> None:
    assert _share(0, tmp_path / "R1", spec_message("device: quantum\n")) == 2
    assert capsys.readouterr().err.splitlines()[:2] == [
        "error: Invalid value 'quantum', expected one of [auto, cuda, cpu]", "    full_key: device"]
    assert not (tmp_path / "R1").exists()


@pytest.mark.unit
@pytest.mark.parametrize("text, first", [
    ("a: [", "error: while parsing a flow node"),  # no YAML
    ("nodez: 1\n", "error: Key 'nodez' not in 'JobConfig'"),  # a key no schema has
])
def test_a_spec_text_that_is_no_spec_is_refused_without_a_traceback(tmp_path, capsys, text, first) -> None:
    assert _share(0, tmp_path / "R1", spec_message(text)) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[0] == first and "Traceback" not in err, err
    assert not (tmp_path / "R1").exists()


@pytest.mark.unit
def test_a_spec_that_does_not_validate_here_is_refused_with_its_problems(tmp_path, capsys) -> None:
    spec = make_spec(launcher="ssh", names=["a", "b"], devices=[1, 1])
    spec.launcher.ssh.port = 70000
    assert _share(0, tmp_path / "R1", spec_message(spec_yaml(spec))) == 2
    assert capsys.readouterr().err == ("[host a] error: launcher.ssh.port: must be 1-65535, got 70000\n"
                                       "[host a]     hint: 22, or leave it to ~/.ssh/config\n")  # whose refusal
    assert not (tmp_path / "R1").exists()


@pytest.mark.unit
def test_a_node_the_spec_has_not_is_refused(tmp_path, capsys) -> None:
    assert _share(2, tmp_path / "R1", spec_message(_two_hosts())) == 2
    assert capsys.readouterr().err == "[host node2] error: --ssh-host 2: the spec has hosts 0..1\n"
    assert not (tmp_path / "R1").exists()


# ------------------------------------------------------------------------------------------- the messages


class Ends(list):
    """In place of the host's agent, whose one part a DriverWatch uses: ``end_job``, recorded."""

    def end_job(self, failure: JobFailure) -> None:
        self.append(failure)


@pytest.mark.unit
def test_a_signal_is_its_own_an_end_goes_to_the_agent_and_the_rest_is_only_heard() -> None:
    """The reading loop as its thread runs it, here in this thread, over messages as the launching `run` writes them.
    The end of the stream is the launching `run` gone: said once, to what stops the share (here: recorded)."""
    end = end_message("a", "lost: ssh exited 255")
    stream = io.BytesIO(beat_message() + signal_message(signal.SIGUSR2) + b"not json\n" + end + b'{"other": 1}\n')
    agent = Ends()
    gone: list[str] = []
    watch = DriverWatch(stream, agent, gone.append, beat_s=0.0)
    watch.heard = 0.0
    got: list[int] = []
    with handling((signal.SIGUSR2,), lambda s, _f: got.append(s)):
        started = time.monotonic()
        watch._read()  # returns at the end of the stream, having said so
    assert got == [signal.SIGUSR2] and gone == [""] and watch.driver_signalled
    assert agent == [JobFailure.from_document(json.loads(end)["end"])]  # as sent: of no rank, host a, its words
    assert (agent[0].rank, agent[0].host, agent[0].text) == (None, "a", "lost: ssh exited 255")
    assert watch.heard >= started


# ------------------------------------------------------------------------------------------- how it ends


_SIGTERM_HANDLED = threading.Event()  # (each child, forked, has its own)


def _says_sigterm(_s: int, _f: object) -> None:
    print("SIGTERM", file=sys.stderr, flush=True)  # as the agent's own handler would stop its ranks
    _SIGTERM_HANDLED.set()


def _says_waited(seconds: float) -> None:
    """The hard stop's wait on a clock of the test's: it says what it was asked to wait, once the agent's handler has
    taken the SIGTERM (what the real wait leaves it time for), without waiting the seconds."""
    _SIGTERM_HANDLED.wait(CHILD_S)
    print(f"waited {seconds:g} s", file=sys.stderr, flush=True)


def _watched(stdin: int, beat_s: float) -> Callable[[], None]:
    def body() -> None:
        signal.signal(signal.SIGTERM, _says_sigterm)
        DriverWatch(open(stdin, "rb"), Ends(), HolderGone(30, sleep=_says_waited), beat_s=beat_s).start()
        threading.Event().wait(CHILD_S)  # the main thread, which runs the handler, until the watch ends the process

    return body


def test_when_stdin_ends_it_stops_as_on_sigterm_and_ends_after_the_hard_stop() -> None:
    read, write = os.pipe()
    os.close(write)  # the launching `run`, or the connection, is gone
    code, said = in_child(_watched(read, beat_s=0.0))
    os.close(read)
    assert (code, said) == (128 + signal.SIGTERM, "SIGTERM\nwaited 30 s\n")  # SIGTERM first, then the hard stop


def test_it_ends_after_the_hard_stop_even_when_nobody_reads_its_stderr_any_more() -> None:
    """The launching `run` and its connection gone, the host's stderr is a pipe without a reader: a flush raises
    (BrokenPipeError), which once killed the watch thread before it ended the process (a share ran on for minutes)."""
    read, write = os.pipe()
    os.close(write)

    def body() -> None:
        out_r, out_w = os.pipe()
        os.close(out_r)  # nobody reads it
        sys.stderr = open(out_w, "w")
        sys.stderr.write("said before, unflushed\n")
        signal.signal(signal.SIGTERM, lambda _s, _f: None)  # the agent, busy elsewhere, takes it and goes on
        waited = []
        DriverWatch(open(read, "rb"), Ends(), HolderGone(30, sleep=waited.append), beat_s=0.0).start()
        threading.Event().wait(CHILD_S)

    code, _ = in_child(body)
    os.close(read)
    assert code == 128 + signal.SIGTERM  # ended by the watch after its hard stop, not by in_child's timer (97)


def test_when_no_beat_comes_it_says_so_and_stops_as_on_sigterm() -> None:
    """No message for BEATS_MISSED (4) beats: a network that drops everything closes no connection."""
    read, write = os.pipe()  # open, and silent
    try:
        code, said = in_child(_watched(read, beat_s=0.05))
    finally:
        os.close(read)
        os.close(write)
    assert code == 128 + signal.SIGTERM
    assert said == ("no word from the launching `run` for 0.2 s (launcher.ssh.keepalive_s=0.05): stopping this host's "
                    "share\nSIGTERM\nwaited 30 s\n")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_before_the_agent_runs_ends_the_share_at_once(signum) -> None:
    def body() -> None:
        signal.signal(signum, _until_agent)
        os.kill(os.getpid(), signum)
        threading.Event().wait(CHILD_S)

    assert in_child(body) == (128 + signum, "")


@pytest.mark.parametrize("argv", [[], ["0"], ["b", "/runs/R1"], ["0", "/runs/R1", "x"]])
def test_a_command_line_it_does_not_take_says_how_it_is_used(argv) -> None:
    assert in_child(lambda: main(argv)) == (2, USAGE + "\n")


def test_a_host_started_again_on_the_hosts_that_remain_is_told_its_first_attempt() -> None:
    stdin = io.BytesIO()
    assert SshHost.of(["1", "/r/runs/x"], stdin) == SshHost(1, Path("/r/runs/x"), stdin, 0)
    assert SshHost.of(["0", "/r/runs/x", "--attempt", "2"], stdin) == SshHost(0, Path("/r/runs/x"), stdin, 2)
    for wrong in (["x", "/r"], ["1"], ["1", "/r", "--attempt"], ["1", "/r", "--attempt", "two"], ["1", "/r", "2"]):
        assert SshHost.of(wrong, stdin) is None, wrong
    assert "[--attempt N]" in USAGE
