"""`run`'s console entry point: it starts the launch agent (runner.app.agent), and with it the host's zygote, which
imports torch for the ranks (over a second), before `run` itself imports Hydra and the runner (a fifth of one), then
hands over to runner.app.cli."""

from __future__ import annotations

import sys


def main() -> None:
    from runner.app.agent import LaunchAgent

    agent = LaunchAgent.start_if_useful(_before_the_script(sys.argv[1:]))
    from runner.app import cli

    cli.main(agent)


def _before_the_script(argv: list[str]) -> list[str]:
    """`run`'s own arguments: those before ``--`` (after it, ``-m`` names a script's module, not a multirun)."""
    return argv[:argv.index("--")] if "--" in argv else argv
