"""launcher=manual: one `run` per host, typed by hand (launcher), and a job that outlives its hosts without a `run`
that holds it: their watch of each other's leases in etcd (watch), this host's rounds (rounds), the decisions made
in etcd (runner.launchers.elastic.decisions)."""

from runner.launchers.manual.launcher import ManualLauncher, agreed_port, hosts_apart_problems

__all__ = ["ManualLauncher", "agreed_port", "hosts_apart_problems"]
