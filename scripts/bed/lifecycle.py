"""A bed's life: `build` makes what its plan says and describes it, `teardown` undoes all of it in any state of
completion."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable

from bed.common import TestbedError, say
from bed.layout import DATA_IF, DECOY_IF, LAN_IF, Paths, Plan
from bed.mpi import mpirun_args, rsh_agent_script
from bed.munge import start_munge
from bed.network import create_host, delete_network, edit_hosts_file, hosts_lines
from bed.processes import namespace_pids, recorded, terminate
from bed.slurm import CRED_EXPIRE, PARTITION, cancel_jobs, start_slurm
from bed.sshd import describe_sshd, start_sshd


def describe(plan: Plan, paths: Paths, decoy_kinds: dict[str, str | None]) -> dict:
    """The JSON description of a running bed."""
    env = {"SLURM_CONF": str(paths.slurm_conf)} if plan.slurm else {}
    return {
        "id": plan.id,
        "tag": plan.tag,
        "state": plan.state,
        "bridge": {"name": plan.bridge, "addr": plan.bridge_addr},
        "subnet": plan.subnet,
        "decoy_subnet": plan.decoy_subnet,
        "data_subnet": plan.data_subnet,
        "data_bridge": {"name": plan.data_bridge, "addr": plan.data_bridge_addr} if plan.data_subnet else None,
        "ctl": {"name": plan.ctl_name, "addr": plan.bridge_addr},
        "hosts": [{"name": h.name, "netns": h.name, "netns_path": h.netns_path, "addr": h.addr, "ifname": LAN_IF,
                   "veth": h.veth,
                   "decoy_ifname": DECOY_IF if h.decoy_addr else None, "decoy_addr": h.decoy_addr,
                   "decoy_kind": decoy_kinds.get(h.name),
                   "data_ifname": DATA_IF if h.data_addr else None, "data_addr": h.data_addr,
                   "data_veth": h.data_veth} for h in plan.hosts],
        "slurm": {"conf": str(paths.slurm_conf), "partition": PARTITION, "nodes": [h.name for h in plan.hosts],
                  "cluster": f"tb{plan.id}", "ctl_host": plan.ctl_name, "ctl_addr": plan.bridge_addr,
                  "ctl_port": plan.ctl_port, "slurmd_port": plan.slurmd_port, "cpus_per_node": plan.cpus,
                  "cred_expire": CRED_EXPIRE,
                  "munge_socket": str(paths.munge_socket)} if plan.slurm else None,
        "env": env,
        "rsh_agent": str(paths.rsh_agent),
        "mpirun_args": mpirun_args(plan, paths),
        "ssh": describe_sshd(plan, paths) if plan.sshd else None,
        "hosts_marker": plan.marker,
        "logs": str(paths.logs),
    }


def build(plan: Plan, paths: Paths) -> dict:
    """Create the bed described by ``plan`` (the bridge exists already) and return its description."""
    decoy_kinds = {}
    for h in plan.hosts:
        decoy_kinds[h.name] = create_host(plan, paths, h)
    decoys = f", decoys ({decoy_kinds[plan.hosts[0].name]}) on {plan.decoy_subnet}" if plan.decoy_subnet else ""
    data = f", data network on {plan.data_subnet}" if plan.data_subnet else ""
    say(f"{len(plan.hosts)} hosts on {plan.subnet}{decoys}{data}")
    marker = plan.marker
    edit_hosts_file(lambda line: not line.endswith(marker), hosts_lines(plan))
    paths.rsh_agent.write_text(rsh_agent_script(plan))
    paths.rsh_agent.chmod(0o755)
    if plan.slurm:
        start_munge(paths)
        start_slurm(plan, paths)
        say(f"Slurm cluster tb{plan.id} up: controller {plan.ctl_name}:{plan.ctl_port}")
    if plan.sshd:
        start_sshd(plan, paths)
        say(f"sshd in every host: ssh -F {paths.ssh_config} HOST")
    description = describe(plan, paths, decoy_kinds)
    paths.description.write_text(json.dumps(description, indent=2) + "\n")
    return description


def teardown(plan: Plan, paths: Paths) -> None:
    """Undo everything of ``plan`` that exists: jobs, daemons, namespace processes, network, /etc/hosts, files.

    Every step is tried whatever became of the ones before; their failures are raised together at the end.
    """
    marker = plan.marker
    daemons = recorded(paths)
    steps: list[tuple[str, Callable[[], None]]] = [
        ("cancel jobs", lambda: cancel_jobs(paths) if plan.slurm else None),
        # by their recorded pids: slurmctld, the slurmds, the sshds; munged last: the Slurm daemons still
        # authenticate while they shut down
        ("stop daemons", lambda: terminate({pid: t for name, (pid, t) in daemons.items() if name != "munged"})),
        ("stop munged", lambda: terminate({pid: t for name, (pid, t) in daemons.items() if name == "munged"})),
        ("kill namespace processes", lambda: terminate(namespace_pids(plan, paths), grace=2)),
        ("delete network", lambda: delete_network(plan)),
        ("clean /etc/hosts", lambda: edit_hosts_file(lambda line: not line.endswith(marker))),
        ("remove files", lambda: remove_runtime_files(paths)),
    ]
    failed = []
    for what, step in steps:
        try:
            step()
        except (TestbedError, OSError) as e:
            failed.append(f"{what}: {e}")
    if failed:
        raise TestbedError("down left things behind (run it again once fixed):\n  " + "\n  ".join(failed))
    paths.plan.unlink(missing_ok=True)


def remove_runtime_files(paths: Paths) -> None:
    for p in paths.runtime():
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
