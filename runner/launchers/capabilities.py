"""What a kind of launch can do, and how it starts processes: one record each launcher declares once
(``capabilities = Capabilities(...)`` on its class), which validation (runner.spec.validation), the plan's rules
(:meth:`runner.launchers.base.Launcher.launch_rules`) and `run` (runner.app.launch) read. The defaults are the
plainest launch's: one that restarts nothing, starts no MPI ranks, shares `run`'s folder and ends with a lost host."""

from __future__ import annotations

from dataclasses import dataclass

RESTART_HINT = ("start it again with the same run_id=...: the same run folder, and the recipe resumes from its last "
                "checkpoint there")


@dataclass(frozen=True, slots=True, kw_only=True)
class Capabilities:
    """The facts of a launcher that do not depend on the job: each a constant of its kind of launch."""

    supports_restarts: bool = False  # launcher.max_restarts > 0 works with it
    restart_hint: str = RESTART_HINT  # what to do instead, where it does not restart a job
    gives_mpi_ranks: bool = False  # its tasks are MPI ranks (backend=mpi needs them)
    shares_run_folder: bool = True  # its hosts' processes share the run folder `run` made
    survives_lost_hosts: bool = False  # topology.min_nodes and spares work with it (runner.spec.elastic)
    lost_host_reason: str = "a lost host ends the job under this launcher"  # why not, where it does not
    takes_hosts_back: bool = False  # a lost host that answers again joins at the next checkpoint (topology.max_nodes)
    hosts_back_reason: str = "a lost host is not taken back under this launcher"  # why not, where it does not
    takes_arrivals: bool = False  # a host the spec does not list may arrive and join, up to topology.max_nodes
    forks_here: bool = False  # `run` forks this host's processes itself (through its launch agent)
    sets_visible_devices: bool = True  # CUDA_VISIBLE_DEVICES from topology.hosts[].gpus (Slurm sets its own)
    hosts_start_apart: bool = False  # each host's share is started by its own `run`
    tasks_end_together: bool = False  # its scheduler kills every task once one has ended badly
    master_source: str = "host 0"  # who the master is, where default_master leaves it to the launch
    pins_master_port: bool = False  # its hosts or tasks cannot learn a port chosen at launch: the spec carries the
    # one master_port agreed on for the run
