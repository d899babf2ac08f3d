"""`run`'s console entry point. The three forms that are not jobs (``--version``, ``--reach``, ``--ssh-host``: asked of
every host of an ssh launch, in every round) end here, without Hydra (a tenth of a CPU-second each); for a job it
starts the launch agent (runner.app.agent), and with it the host's zygote, which imports torch for the ranks (over a
second), before `run` itself imports Hydra and the runner (a fifth of one), then hands over to runner.app.cli."""

from __future__ import annotations

import os
import sys


def main() -> None:
    not_a_job(sys.argv[1:])
    from runner.app.agent import LaunchAgent

    ours = _before_the_script(sys.argv[1:])
    agent = LaunchAgent.start_if_useful(ours, script="--" in sys.argv[1:] or "recipe=script" in ours)
    from runner.app import cli

    cli.main(agent)


def not_a_job(argv: list[str]) -> None:
    """``run --version`` (this runner's and torch's versions: the ssh launch asks every host), ``run --reach <address>
    <port> <node rank>`` (whether this host reaches host 0's rendezvous: runner.worker.reach) and ``run --ssh-host
    <node rank> <run folder>`` (one host's share of a launcher=ssh job, started over ssh: runner.app.ssh_host): each
    ends the process; any other command line returns."""
    from runner.common import exits

    if argv == ["--version"]:
        from runner.environments import versions

        print(versions.installed().line(), flush=True)
        os._exit(exits.OK)
    if argv[:1] == ["--reach"]:
        from runner.worker.reach import main as reach_check

        os._exit(reach_check(argv[1:]))
    if argv[:1] == ["--ssh-host"]:
        from runner.app.ssh_host import main as ssh_host

        ssh_host(argv[1:])


def _before_the_script(argv: list[str]) -> list[str]:
    """`run`'s own arguments: those before ``--`` (after it, ``-m`` names a script's module, not a multirun)."""
    return argv[:argv.index("--")] if "--" in argv else argv
