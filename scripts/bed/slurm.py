"""A real Slurm cluster of the bed's hosts: slurmctld in the root namespace (in a UTS namespace of its own), one
slurmd inside each host's namespace, its configuration and files under the bed's state directory."""

from __future__ import annotations

import contextlib
import os

from bed.common import TestbedError, sh, tail
from bed.layout import Paths, Plan
from bed.processes import alive, recorded, spawn, wait_for

PARTITION = "debug"
# Step credential lifetime, and how long a requeued job waits before it may start again (Slurm's default,
# 120 s, makes every requeue test wait two minutes)
CRED_EXPIRE = 10
DAEMON_START_TIMEOUT = 60.0


def slurm_conf(plan: Plan, paths: Paths) -> str:
    """slurm.conf for a cluster of the bed's hosts, every file under DIR, tuned for quick tests."""
    s = paths.slurm
    nodes = "\n".join(
        f"NodeName={h.name} NodeAddr={h.addr} CPUs={plan.cpus} RealMemory=1024 State=UNKNOWN" for h in plan.hosts)
    return f"""\
# Slurm cluster of test bed {plan.tag} (scripts/testbed.py); everything it uses lives under {plan.state}
ClusterName=tb{plan.id}
SlurmctldHost={plan.ctl_name}({plan.bridge_addr})
SlurmctldPort={plan.ctl_port}
SlurmdPort={plan.slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={paths.munge_socket},cred_expire={CRED_EXPIRE}
CredType=cred/munge
StateSaveLocation={s}/ctld
SlurmdSpoolDir={s}/spool/%n
SlurmctldPidFile={s}/slurmctld.pid
SlurmdPidFile={s}/slurmd-%n.pid
SlurmctldLogFile={paths.log('slurmctld')}
SlurmdLogFile={paths.logs}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig={paths.plugstack}
MailProg=/bin/true
# namespaces share the machine's cgroups and CPUs: track processes by /proc, bind nothing,
# and let a node claim more CPUs than the machine has
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SlurmdParameters=config_overrides
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
JobRequeue=1
# short timeouts: this is a test bed. bf_interval=1: a requeued job starts about 1 s after cred_expire
# (in AuthInfo) instead of at the next 30 s backfill pass
SchedulerParameters=bf_interval=1
KillWait=5
MinJobAge=5
InactiveLimit=0
MessageTimeout=10
SlurmctldTimeout=30
SlurmdTimeout={plan.slurmd_timeout}
{nodes}
PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def slurm_env(paths: Paths) -> dict[str, str]:
    """os.environ without inherited Slurm variables, plus SLURM_CONF of this bed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["SLURM_CONF"] = str(paths.slurm_conf)
    return env


def slurm_logs(plan: Plan, paths: Paths) -> str:
    """The ends of the Slurm daemons' logs (their own log file, or their output where there is none yet)."""
    parts = []
    for daemon in ["slurmctld"] + [f"slurmd-{h.name}" for h in plan.hosts]:
        log = paths.log(daemon)
        parts.append(tail(log if log.exists() and log.stat().st_size else paths.logs / f"{daemon}.out", 15))
    return "\n".join(parts)


def node_states(paths: Paths) -> dict[str, str]:
    """Node name -> long state ("idle", "down*", ...) as sinfo reports it; {} while slurmctld does not answer."""
    done = sh("sinfo", "-h", "-N", "-o", "%N %T", check=False, timeout=15, env=slurm_env(paths))
    if done.returncode != 0:
        return {}
    return dict(line.split() for line in done.stdout.splitlines() if line.strip())


def start_slurm(plan: Plan, paths: Paths) -> None:
    """slurmctld in the root namespace, one slurmd per host in its namespace; wait until all nodes are idle."""
    paths.slurm.mkdir(exist_ok=True)
    (paths.slurm / "ctld").mkdir(exist_ok=True)
    for h in plan.hosts:
        (paths.slurm / "spool" / h.name).mkdir(parents=True, exist_ok=True)
    paths.plugstack.write_text("")  # no SPANK plugins (not the machine's /etc/slurm/plugstack.conf)
    paths.slurm_conf.write_text(slurm_conf(plan, paths))
    # slurmctld only runs where the host name is SlurmctldHost's: give it its own UTS namespace named so.
    spawn(paths, "slurmctld", ["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"',
                               plan.ctl_name, "slurmctld", "-D", "-f", str(paths.slurm_conf)])
    for h in plan.hosts:
        spawn(paths, f"slurmd-{h.name}", ["nsenter", f"--net={h.netns_path}", "--",
                                          "slurmd", "-D", "-N", h.name, "-f", str(paths.slurm_conf)])
    want = {h.name for h in plan.hosts}

    def all_idle() -> bool:
        states = node_states(paths)
        return set(states) == want and all(s == "idle" for s in states.values())

    wait_for("all Slurm nodes idle", all_idle, DAEMON_START_TIMEOUT,
             lambda: f"sinfo: {node_states(paths)}\n{slurm_logs(plan, paths)}", daemons=paths)


def cancel_jobs(paths: Paths) -> None:
    """scancel every job of the cluster and give them a few seconds to go (their processes die with the bed
    anyway). Asks nothing of a slurmctld that is not running: the commands would retry for MessageTimeout."""
    ctld = recorded(paths).get("slurmctld")
    if ctld is None or not alive(*ctld):
        return
    env = slurm_env(paths)
    if sh("scancel", "--partition", PARTITION, check=False, timeout=10, env=env).returncode != 0:
        return  # slurmctld is not answering: nothing to ask it

    def no_jobs() -> bool:
        done = sh("squeue", "-h", "-o", "%A", check=False, timeout=10, env=env)
        return done.returncode != 0 or not done.stdout.strip()

    with contextlib.suppress(TestbedError):
        wait_for("jobs cancelled", no_jobs, 5)
