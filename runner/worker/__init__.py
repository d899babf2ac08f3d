"""What runs on a host: starting and watching its processes (supervise), the rendezvous it holds (rendezvous),
one process from its environment to its exit (rank), the network interface it uses (network), the rank logs
(logs), the report of a failure (failures) and the preflight checks (preflight). Depends on the plan, the
environments and training; never on launchers or reports."""
