"""The harness of tests/runs.py does what it says: every test that starts `run` relies on it to give `run` a user's
environment, to read its output while it waits, to reap it, and to show where the ranks were when it did not end."""

from __future__ import annotations

import os
import signal
import sys

import pytest

import runs
from runs import FOREIGN_NAMES, QUIT_SAID, SHARED_CORES, finish, started, user_env, wait_until

# a stand-in for `run`: says it is ready, answers Ctrl-\ as `run` does (runner/reports/where.py), and waits
ANSWERS_QUIT = f"""
import signal, sys, threading
def where(_sig, _frame):
    print("\\nwhere the ranks are: rank 1 never entered it\\n{QUIT_SAID}the job goes on)", file=sys.stderr, flush=True)
signal.signal(signal.SIGQUIT, where)
print("ready", flush=True)
threading.Event().wait()
"""


@pytest.mark.unit
def test_user_env_is_a_users_shell(monkeypatch) -> None:
    foreign = {"PYTHONPATH": "/checkout", "SLURM_JOB_ID": "7", "OMPI_COMM_WORLD_RANK": "1", "PMI_RANK": "1",
               "PMIX_RANK": "1", "HYDRA_FULL_ERROR": "1", "TORCHELASTIC_RUN_ID": "x", "RANK": "1", "LOCAL_RANK": "1",
               "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0", "MASTER_ADDR": "a", "MASTER_PORT": "1"}
    for name, value in {**foreign, "MY_OWN": "kept"}.items():
        monkeypatch.setenv(name, value)
    env = user_env({"SLURM_CONF": "/bed/slurm.conf"})
    assert not foreign.keys() & env.keys(), foreign.keys() & env.keys()
    assert env["MY_OWN"] == "kept" and env["SLURM_CONF"] == "/bed/slurm.conf" and env["PATH"] == os.environ["PATH"]
    assert FOREIGN_NAMES <= foreign.keys()


@pytest.mark.unit
def test_user_env_says_the_cores_are_shared_unless_asked_for_the_runners_own_threads(monkeypatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # the developer's own: neither the shared cores' nor the default
    assert user_env()["OMP_NUM_THREADS"] == SHARED_CORES["OMP_NUM_THREADS"] == "1"
    assert "OMP_NUM_THREADS" not in user_env(shared_cores=False)
    assert user_env({"OMP_NUM_THREADS": "3"})["OMP_NUM_THREADS"] == "3"  # a test's own value


def test_output_is_read_while_the_test_waits(tmp_path) -> None:
    """A child that writes more than a pipe holds before the marker the test waits for: read as it comes."""
    go = tmp_path / "go"
    os.mkfifo(go)
    marker = tmp_path / "marker"
    code = (f"import sys; sys.stdout.write('o' * 2**20); sys.stderr.write('e' * 2**20); sys.stdout.flush(); "
            f"open({str(marker)!r}, 'w').close(); open({str(go)!r}).read()")
    with started([sys.executable, "-c", code], cwd=tmp_path) as proc:
        wait_until(marker.exists, 30, "the marker written", alive=[proc])
        with open(go, "w"):
            pass
        done = proc.wait(30)
    assert (done.code, len(done.stdout), len(done.stderr)) == (0, 2**20, 2**20)


def test_a_command_that_does_not_end_is_asked_where_its_ranks_are_then_killed(tmp_path) -> None:
    with started([sys.executable, "-c", ANSWERS_QUIT], cwd=tmp_path) as proc:
        wait_until(lambda: proc.said("ready"), 30, "ready", alive=[proc])
        with pytest.raises(AssertionError) as failed:
            proc.wait(0.5)
        assert proc.poll() == -signal.SIGKILL
    said = str(failed.value)
    assert said.startswith("not ended within 0.5 s: asked where its ranks are (SIGQUIT), then killed:\n"), said
    assert "where the ranks are: rank 1 never entered it" in said and "--- stdout" in said and "ready" in said


def test_a_command_without_an_answer_is_killed_all_the_same(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(runs, "QUIT_WAIT_S", 0.5)
    ignores = "import signal, threading; signal.signal(signal.SIGQUIT, signal.SIG_IGN); print('ready', flush=True); " \
              "threading.Event().wait()"
    with started([sys.executable, "-c", ignores], cwd=tmp_path) as a, \
            started([sys.executable, "-c", ANSWERS_QUIT], cwd=tmp_path, merged=True) as b:
        wait_until(lambda: a.said("ready") and b.said("ready"), 30, "both ready", alive=[a, b])
        with pytest.raises(AssertionError) as failed:
            finish([a, b], timeout=0.5)
        assert (a.poll(), b.poll()) == (-signal.SIGKILL, -signal.SIGKILL)
    said = str(failed.value)
    assert said.startswith("not all done within 0.5 s: asked where its ranks are (SIGQUIT; no answer within 0.5 s), "
                           "then killed:\n"), said
    assert said.count("--- stdout") == 2 and "where the ranks are: rank 1" in said  # both, the one that answered


def test_a_test_that_fails_while_its_command_runs_says_where_it_was_and_reaps_it(tmp_path) -> None:
    with pytest.raises(ZeroDivisionError) as failed:
        with started([sys.executable, "-c", ANSWERS_QUIT], cwd=tmp_path) as proc:
            wait_until(lambda: proc.said("ready"), 30, "ready", alive=[proc])
            1 / 0
    assert proc.poll() == -signal.SIGKILL
    (note,) = failed.value.__notes__
    assert note.startswith("it was still running: asked where its ranks are (SIGQUIT), then killed:\n"), note
    assert "where the ranks are: rank 1 never entered it" in note


def test_waiting_fails_at_once_with_the_output_of_a_process_that_ended(tmp_path) -> None:
    with started([sys.executable, "-c", "import sys; print('out'); sys.exit('gave up')"], cwd=tmp_path) as proc:
        with pytest.raises(AssertionError) as failed:
            wait_until(lambda: False, 60, "never", alive=[proc])
    said = str(failed.value)
    assert said.startswith("ended (exit 1) before never:\n") and "out\n" in said and "gave up" in said, said
