"""What runs on a host: its host agent (host_agent, the loop over attempts, restart included; its phases: preparation,
attempt with its state machine attempt_state, monitor, executor and diagnostics, attempt_report), a rank as a
process of its own (rank_process, stdio) and its body (rank: a recipe; script: a torchrun-style script), the
relay of the ranks' output to their logs and the terminal (relay), the rendezvous the agent holds (rendezvous),
the job's channel across hosts and every rank's ending in host 0's folder (channel, endings), the network
interface it uses (network), the report of a failure (failures), a rank's watch for hangs (watch) and the
preflight checks (preflight). Depends on the plan, the environments and training; never on launchers or reports."""
