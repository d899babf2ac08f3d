"""The ssh launch's running part (runner.launchers.ssh.session) with `sh -c` scripts in place of `ssh HOST run
--ssh-host ...`: each reads what the launching `run` says on its stdin as a host's `run` does (the spec, then one
message a line) and does what the test needs: writes output, exits with a status, sends this process a signal (as a
user's Ctrl-C or `kill -USR1` would), or is lost. Covered: the spec on every host's stdin, output relayed a whole
line at a time, signals passed on, a second Ctrl-C and launcher.grace_s closing the sessions (SIGKILL after a
SIGTERM ignored), a host that fails or is lost ending the job on the others, the exit status, the beats.

What needs a real ssh and a host's real `run` (ssh's keepalives, a real host killed mid-run, `run` itself killed):
tests/e2e/test_ssh.py, test_a_host_killed_mid_run_ends_the_job_on_every_host_within_seconds,
test_a_host_cut_off_the_network_is_lost_after_its_keepalives_and_stops_by_itself and
test_nothing_outlives_run_when_it_is_killed."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.launchers.ssh import session as ssh_session
from runner.launchers.ssh.launcher import SshHost
from runner.launchers.ssh.session import Ended, Session, Sessions

pytestmark = pytest.mark.timeout(10)  # not `unit`: every test starts processes (a few ms each); a host that waits for
# a message that never comes fails the test after 10 s

SPEC = "run_id: R1\nrecipe:\n  note: héllo 🙂\n"  # what the hosts are sent first (not parsed here)
TAKE_SPEC = 'read n && head -c "$n" > "$1" && '  # a host's first step: the spec, into the file $1
HEARD = 'read -r line && printf "%s\\n" "$line" > "$2"'  # the next message, into the file $2
STOP = signal.SIGUSR1  # launcher.stop_signal


def host(index: int, script: str, *args: object) -> SshHost:
    """Host ``index`` (a, b, ...) whose share is ``sh -c SCRIPT sh ARGS``."""
    name = "abc"[index]
    start = ("sh", "-c", script, "sh", *(str(a) for a in args))
    return SshHost(index=index, name=name, label=f"host {index} ({name})", destination=name, ranks=(index,), run="run",
                   check=(), dials=False, start=start, collect=())


def sessions(*hosts: SshHost, grace_s: float = 10.0, beat_s: float = 0.0) -> Sessions:
    return Sessions(hosts, SPEC, STOP, grace_s, beat_s)


def heard(path: Path) -> dict:
    return json.loads(path.read_text())


def test_every_host_gets_the_spec_and_a_job_whose_hosts_all_end_well_is_ok(tmp_path, capfd) -> None:
    got = [tmp_path / "spec0", tmp_path / "spec1"]
    ended = sessions(host(0, TAKE_SPEC + "echo zero", got[0]), host(1, TAKE_SPEC + "echo one >&2", got[1])).run()
    assert ended == Ended(0, None, None, frozenset())
    assert [p.read_text() for p in got] == [SPEC, SPEC]
    out, err = capfd.readouterr()
    assert (out, err) == ("zero\n", "one\n")


def test_output_is_relayed_a_whole_line_at_a_time_and_a_last_line_gets_its_end(capfd) -> None:
    script = TAKE_SPEC + "printf par; printf 'tial\\n'; printf err >&2; printf 'or\\n' >&2; printf tail"
    assert sessions(host(0, script, "/dev/null")).run().code == 0
    assert capfd.readouterr() == ("partial\ntail\n", "error\n")


def _fed(all_: Sessions, session: Session, data: bytes) -> None:
    """``data`` through the host's `cat` to its stdout, once there relayed by ``all_`` (as its loop would)."""
    session.tell(data)
    fd = session.proc.stdout.fileno()
    assert select.select([fd], [], [], 5)[0] == [fd], "cat did not echo within 5 s"
    all_._relay(session, session.proc.stdout)


def test_lines_of_two_hosts_never_mix(capfd) -> None:
    """Host a's line begun ("zero-") is held while host b's whole line goes out, then goes out whole. The relay is
    driven a step at a time (each host a `cat`), as the loop does, for the order to be the test's."""
    all_ = sessions(host(0, 'read n && exec cat'), host(1, 'read n && exec cat'))
    all_.spec_text = ""  # the spec: "0\n", which `read n` takes
    try:
        all_._start()
        a, b = all_.sessions
        _fed(all_, a, b"zero-")
        assert capfd.readouterr().out == ""
        _fed(all_, b, b"one\n")
        _fed(all_, a, b"line\nlast")
        assert capfd.readouterr().out == "one\nzero-line\n"
        a.proc.stdin.close()  # cat ends: its stream's end brings what is left of its last line
        assert a.proc.wait(5) == 0
        all_._relay(a, a.proc.stdout)
        assert capfd.readouterr().out == "last\n" and list(a.partial) == [a.proc.stderr.fileno()]
    finally:
        for s in all_.sessions:
            s.proc.kill()
            s.proc.wait()
            for stream in (s.proc.stdin, s.proc.stdout, s.proc.stderr):
                stream.close()
        all_.selector.close()


def test_telling_a_session_that_is_gone_is_no_error() -> None:
    proc = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    session = Session(host(0, ""), proc)
    session.tell(b"one\n")
    proc.stdin.close()
    assert proc.stdout.read() == b"one\n" and proc.wait(5) == 0
    session.tell(b"two\n")  # its stdin closed: nothing to tell, no error
    gone = subprocess.Popen(["true"], stdin=subprocess.PIPE)
    gone.wait(5)
    Session(host(0, ""), gone).tell(b"x\n")  # nobody reads: a broken pipe, said by its exit instead
    gone.stdin.close()


def test_a_host_whose_run_fails_ends_the_job_on_the_others_and_its_exit_status_is_runs(tmp_path, capfd) -> None:
    told = tmp_path / "told"
    ended = sessions(host(0, TAKE_SPEC + "exit 3", "/dev/null"),
                     host(1, TAKE_SPEC + HEARD, "/dev/null", told)).run()
    assert ended == Ended(3, None, None, frozenset())  # not lost: no cause, its status
    end = heard(told)["end"]
    assert (end["rank"], end["host"], end["text"]) == (None, "a", "its `run` ended with exit 3")
    assert capfd.readouterr().err == "ssh: ending the job on host 1 (b)\n"


def test_a_host_killed_is_lost_the_others_are_told_and_the_job_fails(tmp_path, capfd) -> None:
    told = tmp_path / "told"
    job = sessions(host(0, TAKE_SPEC + "kill -KILL $$", "/dev/null"), host(1, TAKE_SPEC + HEARD, "/dev/null", told))
    before = time.time()
    ended = job.run()
    why = "ssh was killed by SIGKILL: the host, its network or its `run` is gone"
    assert before <= ended.lost_at <= time.time()  # when it was seen lost: what a lost host's record counts from
    assert ended == Ended(1, None, f"host 0 (a) was lost: {why}", frozenset({0}), ended.lost_at, {0: why})
    assert [s.code for s in job.sessions] == [128 + signal.SIGKILL, 0]
    end = heard(told)["end"]
    assert (end["rank"], end["host"], end["text"]) == (None, "a", f"lost: {why}")
    assert capfd.readouterr().err == f"\nssh: host 0 (a) lost: {why}\nssh: ending the job on host 1 (b)\n"


def test_a_host_that_goes_on_after_the_job_ended_is_closed_which_is_no_loss(monkeypatch) -> None:
    """Host b hears of the end and goes on (as if stuck): END_WAIT_S later its session is closed."""
    monkeypatch.setattr(ssh_session, "END_WAIT_S", 0.0)
    job = sessions(host(0, TAKE_SPEC + "exit 3", "/dev/null"),
                   host(1, TAKE_SPEC + "read -r end && read -r more", "/dev/null"))
    assert job.run() == Ended(3, None, None, frozenset())
    assert [s.code for s in job.sessions] == [3, 128 + signal.SIGTERM]


@contextlib.contextmanager
def relayed_into(fifo: Path) -> Iterator[None]:
    """What the relay writes to descriptor 2 goes into the named pipe ``fifo`` while the block runs, for a host to
    read back (and so to know that its lines were read)."""
    os.mkfifo(fifo)
    end = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    saved = os.dup(2)
    os.dup2(end, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(end)


def test_a_lost_host_is_named_with_ssh_s_own_words(tmp_path, capsys) -> None:
    """ssh exits 255: the host is lost, and of its stderr's last lines the one that is ssh's own says how (the
    host's own lines, "[host a] ...", are not). The host exits once its three lines were relayed."""
    relayed, seen = tmp_path / "relayed", tmp_path / "seen"
    lines = ("[host a] step 3", "Connection to a closed by remote host.", "[host a] bye")
    script = TAKE_SPEC + 'printf "%s\\n" "$3" "$4" "$5" >&2 && timeout 5 head -n 3 "$2" > "$6"; exit 255'
    with relayed_into(relayed):
        ended = sessions(host(0, script, "/dev/null", relayed, *lines, seen)).run()
    assert seen.read_text() == "".join(f"{line}\n" for line in lines)
    why = "ssh exited 255 (Connection to a closed by remote host.): the host, its network or its `run` is gone"
    assert ended == Ended(1, None, f"host 0 (a) was lost: {why}", frozenset({0}), ended.lost_at, {0: why})
    assert capsys.readouterr().err == f"\nssh: host 0 (a) lost: {why}\n"  # no other host to end the job on


def test_ctrl_c_is_passed_to_every_host_and_run_ends_as_signalled(tmp_path) -> None:
    """Host a sends this process SIGINT, as a Ctrl-C on its terminal would; each host hears it and exits 130, as a
    host's `run` does: no host is lost, nobody is told to end the job."""
    told = [tmp_path / "told0", tmp_path / "told1"]
    ended = sessions(host(0, TAKE_SPEC + 'kill -INT "$3" && ' + HEARD + " && exit 130", "/dev/null", told[0],
                          os.getpid()),
                     host(1, TAKE_SPEC + HEARD + " && exit 130", "/dev/null", told[1])).run()
    assert ended == Ended(130, signal.SIGINT, None, frozenset())
    assert [heard(p) for p in told] == [{"signal": signal.SIGINT}] * 2


def test_the_stop_signal_is_passed_on_and_a_job_that_stops_on_it_is_ok(tmp_path) -> None:
    told = [tmp_path / "told0", tmp_path / "told1"]
    ended = sessions(host(0, TAKE_SPEC + 'kill -USR1 "$3" && ' + HEARD, "/dev/null", told[0], os.getpid()),
                     host(1, TAKE_SPEC + HEARD, "/dev/null", told[1])).run()
    assert ended == Ended(0, None, None, frozenset())  # the ranks checkpoint and return: not a signalled end
    assert [heard(p) for p in told] == [{"signal": STOP}] * 2


def test_a_second_ctrl_c_closes_the_sessions_at_once(tmp_path) -> None:
    """The hosts hear the first and go on (launcher.grace_s is 60 s here); the second terminates every ssh at once."""
    told = tmp_path / "told"
    job = sessions(host(0, TAKE_SPEC + 'kill -INT "$3" && ' + HEARD + ' && kill -INT "$3" && read -r more',
                        "/dev/null", told, os.getpid()),
                   host(1, TAKE_SPEC + "read -r first && read -r more", "/dev/null"), grace_s=60.0)
    started = time.monotonic()
    ended = job.run()
    assert ended == Ended(130, signal.SIGINT, None, frozenset())  # closed by this `run`: not lost
    assert [s.code for s in job.sessions] == [128 + signal.SIGTERM] * 2
    assert heard(told) == {"signal": signal.SIGINT} and time.monotonic() - started < 30  # not after the grace


def test_hosts_still_running_after_the_grace_are_closed_and_one_that_ignores_sigterm_is_killed(monkeypatch) -> None:
    """launcher.grace_s (+ STOP_MARGIN_S) after a Ctrl-C: SIGTERM to every ssh still there; KILL_WAIT_S later,
    SIGKILL to one that is still there."""
    monkeypatch.setattr(ssh_session, "STOP_MARGIN_S", 0.0)
    monkeypatch.setattr(ssh_session, "KILL_WAIT_S", 0.1)
    job = sessions(host(0, TAKE_SPEC + "trap '' TERM; kill -INT \"$2\" && read -r first && read -r more", "/dev/null",
                        os.getpid()),
                   host(1, TAKE_SPEC + "read -r first && read -r more", "/dev/null"), grace_s=0.2)
    started = time.monotonic()
    ended = job.run()
    took = time.monotonic() - started
    assert ended == Ended(130, signal.SIGINT, None, frozenset())
    assert [s.code for s in job.sessions] == [128 + signal.SIGKILL, 128 + signal.SIGTERM]
    assert [s.host.index for s in job.order] == [1, 0]  # b at the SIGTERM, a only at the SIGKILL
    assert 0.3 <= took < 5  # not before the grace and the kill's wait


def test_every_host_hears_a_beat_every_keepalive(tmp_path) -> None:
    told = tmp_path / "told"
    ended = sessions(host(0, TAKE_SPEC + HEARD, "/dev/null", told), beat_s=0.05).run()
    assert ended == Ended(0, None, None, frozenset()) and heard(told) == {"beat": True}


def test_a_hosts_reports_are_taken_out_of_its_stderr_and_heard(tmp_path, capfd) -> None:
    """The host agent's report lines (runner.launchers.ssh.protocol.REPORT) on a host's stderr, between its other lines:
    they reach ``on_report`` with the host's index, and the terminal sees only the rest."""
    from runner.worker.agent_reports import report_line
    from runner.worker.agent_reports import AttemptBegan, StepReached

    reports = [AttemptBegan(attempt=1, at=5.0), StepReached(attempt=1, step=7, resumed=5, at=6.0)]
    lines = [b"[host b] one\n", report_line(reports[0]), b"[host b] two\n", report_line(reports[1])]
    out = tmp_path / "stderr"
    out.write_bytes(b"".join(lines))
    heard_here: list = []
    job = Sessions((host(1, TAKE_SPEC + 'cat "$2" >&2', "/dev/null", out),), SPEC, STOP, 10.0, 0.0,
                   on_report=lambda index, report: heard_here.append((index, report)))
    assert job.run() == Ended(0, None, None, frozenset())
    assert heard_here == [(1, reports[0]), (1, reports[1])]
    assert capfd.readouterr().err == "[host b] one\n[host b] two\n"
