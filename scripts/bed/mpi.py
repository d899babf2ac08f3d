"""What Open MPI's mpirun needs to reach the bed's hosts: an ssh look-alike (the rsh agent) and its arguments."""

from __future__ import annotations

from pathlib import Path

from bed.layout import Paths, Plan


def rsh_agent_script(plan: Plan) -> str:
    """A /bin/sh stand-in for ssh: ``agent [ssh options] [user@]HOST command...`` runs the command in HOST's
    namespace through ``sh -c`` (as sshd would, with the words joined by spaces), and exits with its status.

    TMPDIR is set to DIR/tmp/HOST: with one /tmp and one host name for all namespaces, the orteds of different
    hosts shared Open MPI's session directory and about 1 run in 8 failed (orted segfault in
    hwloc_shmem_topology_write, or "mkdir ... File exists" in orte_session_dir).
    """
    tmp = Paths(Path(plan.state)).tmp
    cases = "\n".join(f"  {h.name}|{h.addr}) ns={h.netns_path} tmp={tmp / h.name} ;;" for h in plan.hosts)
    return f"""#!/bin/sh
# rsh/ssh agent of test bed {plan.tag} (scripts/testbed.py), for Open MPI's plm_rsh_agent.
while [ $# -gt 0 ]; do
  case "$1" in
    -[BbcDEeFIiJLlmOoPpQRSWw]) shift 2 ;;  # ssh options that take a value
    -*) shift ;;
    *) break ;;
  esac
done
[ $# -ge 2 ] || {{ echo "usage: $0 [ssh options] HOST command..." >&2; exit 255; }}
host=${{1#*@}}
shift
case "$host" in
{cases}
  *) echo "$0: no host $host in test bed {plan.tag}" >&2; exit 255 ;;
esac
# a /tmp of its own per host, as separate machines have: Open MPI's session directory is
# $TMPDIR/ompi.HOSTNAME.UID, and the namespaces share one host name and one /tmp
mkdir -p "$tmp" && export TMPDIR="$tmp"
exec nsenter --net="$ns" -- /bin/sh -c "$*"
"""


def mpirun_args(plan: Plan, paths: Paths) -> list[str]:
    """What ``mpirun``, started in the root namespace, needs to run ranks on the bed's hosts (found by experiment
    with Open MPI 4.1.4 and a small C program doing MPI_Allreduce and MPI_Sendrecv across hosts).

    * ``--allow-run-as-root``: the bed runs as root; ``--oversubscribe``: the hosts share the machine's few cores.
    * ``plm_rsh_agent``: start the daemons (orted) through DIR/rsh-agent instead of ssh. Needed.
    * ``btl_tcp_if_include SUBNET``: needed with decoys. Every host's decoy0 is on the same decoy subnet, so the
      TCP BTL takes it as a route between hosts, and sends into an interface that drops everything: every
      run hung until killed. Without decoys the agent alone was enough.
    * ``oob_tcp_if_include SUBNET``: not needed in the experiments (the orteds reach mpirun through their default
      route), kept so that daemons never offer or try the decoy and root-namespace addresses.
    * ``plm_rsh_no_tree_spawn 1``: tree spawn worked too (4 hosts); this way only mpirun calls the agent.
    * ``pml ob1``, ``btl tcp,self,vader``: no probing of UCX, openib and libfabric (0.33 s instead of 0.51 s a
      run), and no transport that ignores btl_tcp_if_include.
    """
    return ["--allow-run-as-root", "--oversubscribe",
            "--mca", "plm_rsh_agent", str(paths.rsh_agent),
            "--mca", "btl_tcp_if_include", plan.subnet,
            "--mca", "oob_tcp_if_include", plan.subnet,
            "--mca", "plm_rsh_no_tree_spawn", "1",
            "--mca", "pml", "ob1",
            "--mca", "btl", "tcp,self,vader"]
