"""runner.app.agent: the launch agent `run` forks as it starts answers validation's questions about the recipe
target (from a child of its own, torch already imported), exits when no launch follows, and runs a launch handed
over whole with its zygote."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(120)

SCRIPT = textwrap.dedent("""
    import os, sys, time
    from runner.app.agent import LaunchAgent
    agent = LaunchAgent.start_if_useful([])
    assert agent is not None, "no agent on this machine"
    ok = agent.target_problem("runner.recipes.digits:main", None)
    bad = agent.target_problem("runner.recipes.digits:nope", None)
    agent.cancel()
    _, status = os.waitpid(agent.pid, 0)
    print(ok, "|", bad.message, "|", os.waitstatus_to_exitcode(status))
""")


def test_the_agent_tries_targets_then_exits_when_no_launch_follows(tmp_path) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    ok, bad, code = (part.strip() for part in done.stdout.strip().split("|"))
    assert ok == "None" and code == "0"
    assert bad.startswith("module 'runner.recipes.digits' (") and bad.endswith("defines no 'nope'; its functions: "
                                                                                "accuracy, build_model, datasets, load_digits, main, "
                                                                                "stratified_split")


def test_no_agent_for_help_the_composed_config_a_sweep_the_forms_that_are_no_job_or_one_core() -> None:
    """The decision alone, for any machine (on one core every answer would be no)."""
    from runner.app.agent import LaunchAgent

    assert LaunchAgent.useful([], 2) and LaunchAgent.useful(["topology=1x4"], 64)
    for argv in (["--help"], ["--cfg", "job"], ["-m", "topology=1x1,1x2"], ["--version"], ["--reach", "a", "1", "0"],
                 ["--ssh-host", "0", "/runs/R1"]):
        assert not LaunchAgent.useful(argv, 64), argv
    assert not LaunchAgent.useful([], 1)  # no core to spare: `run` does it all in-process
    assert LaunchAgent.start_if_useful(["--help"]) is None


@pytest.mark.unit
def test_no_agent_for_a_script_where_nothing_is_forked_here() -> None:
    """A script has no recipe target to try: with a launcher whose processes start elsewhere, or in a dry run, no
    agent (and so no torch imported here); a target to try, or a script whose ranks are forked here, has one. The
    launchers named are those whose capabilities do not fork here."""
    from runner.app.agent import _NOTHING_FORKED_HERE, LaunchAgent
    from runner.launchers import LAUNCHERS

    elsewhere = sorted(f"launcher={name}" for name, cls in LAUNCHERS.items() if not cls.capabilities.forks_here)
    assert elsewhere == sorted(a for a in _NOTHING_FORKED_HERE if a.startswith("launcher=")) and elsewhere
    for argv in ([launcher] for launcher in elsewhere):
        assert not LaunchAgent.useful(argv, 64, script=True), argv
        assert LaunchAgent.useful(argv, 64), argv  # the recipe target is tried in the agent's zygote
    assert not LaunchAgent.useful(["topology=1x4", "dry_run=true"], 64, script=True)
    for forked_here in (["launcher=local"], ["launcher=manual"], ["topology=1x4"], []):
        assert LaunchAgent.useful(forked_here, 64, script=True), forked_here


DISMISSED = textwrap.dedent("""
    import os, time
    from runner.app.agent import LaunchAgent
    agent = LaunchAgent.start_if_useful([])
    assert agent is not None, "no agent on this machine"
    started = time.monotonic()
    agent.dismiss()  # at once, while it still imports torch
    try:
        os.waitpid(agent.pid, os.WNOHANG)
        print("still a child of ours")
    except ChildProcessError:
        print("gone", os.path.exists(f"/proc/{agent.pid}"))
""")


def test_an_agent_with_nothing_left_to_do_is_killed_and_reaped_at_once(tmp_path) -> None:
    """A dry run, or a launcher whose processes a scheduler starts: the agent is not left importing torch."""
    done = subprocess.run([sys.executable, "-c", DISMISSED], cwd=tmp_path, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "gone False"


WHOLE = textwrap.dedent("""
    import os, signal
    from runner.app.agent import LaunchAgent
    from runner.launchers.base import LaunchOutcome

    class Rounds:
        \"\"\"What the agent needs of a launcher handed over whole (runner.launchers.base.AgentRuns.launch).\"\"\"
        zygote = None  # the agent sets its own

        class plan:
            class rules:
                stop_signal = signal.SIGUSR1

        def launch(self, request):
            zygote = self.zygote()
            tried = zygote.try_target("runner.recipes.digits:nope", None)
            return LaunchOutcome(code=3, cause=f"{request}|{os.getpid()}|{zygote.process.pid}|{tried.message[:30]}")

    agent = LaunchAgent.start_if_useful([])
    assert agent is not None, "no agent on this machine"
    assert agent.target_problem("runner.recipes.digits:main", None) is None
    outcome = agent.launch(Rounds(), "the request")
    request, ran_in, zygote, tried = outcome.cause.split("|")
    print(outcome.code, request, ran_in == str(agent.pid), zygote != ran_in, tried, sep="|")
""")


def test_a_launch_handed_over_whole_runs_in_the_agent_with_its_zygote_and_its_outcome_comes_back(tmp_path) -> None:
    """A manual job that outlives its hosts: the agent runs the launch (each round's ranks forked from the zygote
    that tried the target), and `run` gets its LaunchOutcome for the summary."""
    done = subprocess.run([sys.executable, "-c", WHOLE], cwd=tmp_path, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "3|the request|True|True|module 'runner.recipes.digits'", done.stdout
