"""launcher=manual: one `run` per host, typed by hand (launcher), and a job that outlives its hosts without a `run`
that holds it: the hosts' meeting points (meeting), their watch of each other (watch), this host's rounds (rounds)."""

from runner.launchers.manual.launcher import ManualLauncher, agreed_port, hosts_apart_problems

__all__ = ["ManualLauncher", "agreed_port", "hosts_apart_problems"]
