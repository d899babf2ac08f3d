"""What launcher=manual's dry run says: the command to type on each host (its own launcher.manual.host, the run id
and master port every host must share), on each spare, and on a host that arrives where topology.max_nodes leaves
room; and, for a job that outlives its hosts, how it goes on, where the hosts decide it and how a lost host is found.
"""

from __future__ import annotations

from runner.launchers.base import HostCommand, Invocation
from runner.launchers.elastic.decisions import BACK_WITHIN_BEATS
from runner.launchers.elastic.etcd_member import OwnCluster
from runner.launchers.elastic.liveness import BEATS_MISSED
from runner.plan.processes import Plan
from runner.spec.elastic import elasticity
from runner.spec.job import Job

PINNED = ("launcher.manual.host=", "launcher.manual.addr=", "run_id=", "init.master_port=", "dry_run=")  # the keys
# each host's command sets for itself, or that every host's must share: dropped from what was typed


def host_commands(plan: Plan, inv: Invocation) -> list[HostCommand]:
    """The command of each host, spare and host that arrives: what was typed, with the keys of :data:`PINNED`."""
    job, spec = plan.job, plan.job.spec
    base = [inv.run_command]
    if inv.config_dir:
        base += ["--config-dir", inv.config_dir]
    if inv.config_name:
        base += ["--config-name", inv.config_name]
    base += [o for o in inv.overrides if not o.startswith(PINNED)]
    base.append(f"run_id={spec.run_id}")
    if spec.init.master_port:
        base.append(f"init.master_port={spec.init.master_port}")
    commands = []
    for host in job.hosts:
        n = plan.processes_per_host[host.index]
        commands.append(HostCommand(host=f"host {host.index} ({host.reach or host.label})",
                                    argv=(*base, f"launcher.manual.host={host.index}"),
                                    note=f"starts {n} process(es)", cwd=inv.cwd))
    for spare in job.spares:
        commands.append(HostCommand(host=f"spare {spare.label}", argv=(*base, f"launcher.manual.host={spare.label}"),
                                    note="waits, ready to take a lost host's place", cwd=inv.cwd))
    most = spec.topology.max_nodes or len(job.hosts)
    if elasticity(job).enabled and most > len(job.hosts) + len(job.spares):
        commands.append(HostCommand(host=f"a host that arrives (the spec does not list it; up to "
                                         f"topology.max_nodes={most})",
                                    argv=(*base, "launcher.manual.host=NAME", "launcher.manual.addr=ADDRESS"),
                                    note="joins at a checkpoint", cwd=inv.cwd))
    return commands


def rounds_said(job: Job) -> tuple[HostCommand, ...]:
    """What the dry run says of a job that outlives its hosts: how it goes on, where the hosts decide it, and how a
    lost host is found."""
    if not elasticity(job).enabled:
        return ()
    manual = job.spec.launcher.manual
    every = manual.keepalive_s
    if manual.etcd:
        where = (f"who goes on after a loss is decided in your etcd ({', '.join(manual.etcd)}): one decision "
                 f"per attempt, made once (a compare-and-swap), which every host follows; it decides while a "
                 f"majority of its own members is up")
    else:
        own = OwnCluster.of(job)
        where = (f"who goes on after a loss is decided in the job's own etcd: a member started by each host's and "
                 f"spare's `run` ({own.size}: {', '.join(own.names)}; clients on port {own.client_port}, peers on "
                 f"{own.peer_port}, derived from the run id), one decision per attempt, made once (a "
                 f"compare-and-swap), which every host follows; it decides while {own.floor} of its {own.size} "
                 f"members are up, so the job goes on down to {max(own.floor, elasticity(job).min_nodes)} "
                 f"host(s)")
    return (HostCommand(host=elasticity(job).line(), argv=None),
            HostCommand(host=where, argv=None),
            HostCommand(host=f"each host's `run` keeps a lease in etcd alive every {every} s "
                             f"(launcher.manual.keepalive_s): a host whose lease expires ({BEATS_MISSED * every} s "
                             f"without a keepalive: its `run`, machine or network gone) and whose key stays gone "
                             f"{BACK_WITHIN_BEATS * every} s more is lost, and its peers end the attempt",
                        argv=None))
