"""A test bed of "hosts" on one Linux machine: network namespaces on a bridge, optionally a real Slurm cluster.

Run as root. Subcommands::

    testbed.py up   --state DIR [--hosts N] [--cpus C] [--slurm] [--sshd] [--decoy] [--data-network]
                    [--prefix P]
    testbed.py down --state DIR
    testbed.py env  --state DIR
    testbed.py exec --state DIR HOST -- CMD...

What ``up`` builds (``<p>`` is the prefix, ``<id>`` a random 4-hex-digit id, so that several beds can run at once):

* a bridge ``<p><id>br`` in the root namespace with address x.y.z.1/24 on a random 10.x.y.0/24 subnet that no
  interface or route of the machine uses;
* host i (1-based): network namespace ``<p><id>h<i>`` (also its host name and Slurm node name), joined to the
  bridge by a veth pair (``<p><id>v<i>`` in the root namespace, ``lan0`` inside) with address x.y.z.(10+i)/24,
  ``lo`` up and a default route via the bridge. Hosts reach each other over the bridge (layer 2) and the root
  namespace directly, so no ip_forward and no firewall change are needed. Nothing beyond is reachable, DNS
  servers included: they get an ``unreachable`` route, so that a name missing from /etc/hosts fails at once;
* with ``--decoy``: in every namespace, before ``lan0`` (so it is listed first), an UP interface ``decoy0`` with
  an address on another subnet that reaches nothing: a ``dummy`` link, or an ``ifb`` link where the kernel has
  no dummy driver (both drop what is sent to them);
* with ``--data-network``: a second bridge ``<p><id>db`` (x.y.z.1/24 on a second free 10.x.y.0/24 subnet) and in
  every namespace, after ``lan0``, an interface ``data0`` joined to it by a veth pair (``<p><id>d<i>`` in the root
  namespace) with address x.y.z.(10+i)/24 and no route but the subnet's own: a host's data link can be cut (link
  down, blackhole routes) while its ``lan0`` still answers;
* lines ``ADDR NAME  # testbed:<p><id>`` in /etc/hosts for every host and for ``<p><id>ctl`` (the bridge
  address), so the names resolve everywhere, namespaces included (they share the mount namespace);
* ``DIR/rsh-agent``: an ssh look-alike for Open MPI's ``plm_rsh_agent`` that runs the command in the host's
  namespace (``nsenter --net``) with TMPDIR=DIR/tmp/HOST; the description's ``mpirun_args`` say what else
  mpirun needs (see :func:`mpirun_args`);
* with ``--slurm``: a munged, a slurmctld (root namespace) and one slurmd per host (inside its namespace), all
  with their configuration, sockets, state, logs and PID files under DIR, on free ports picked at run time.
  slurmctld refuses to run unless the host name is SlurmctldHost's ("This host (vm/vm) not a valid
  controller"), so it runs in a UTS namespace of its own named ``<p><id>ctl``. The hosts keep the machine's
  host name (only the network is theirs): ``hostname`` says the same everywhere, as DESIGN.md's
  "host name resolves to 127.0.x.x" case wants.

``up`` prints a JSON description (also written to DIR/testbed.json) and exits 0, or tears down what it made and
exits 1 with the reason (daemon logs included). ``down`` undoes everything ``up`` recorded in DIR/plan.json
(written before anything is created), in any state of completion: it cancels the jobs, stops the daemons by
their recorded PID and start time (SIGTERM, then SIGKILL), kills every process left in the namespaces
(slurmstepd and job tasks included), deletes namespaces, links and /etc/hosts lines. It is idempotent, tries
every step even when one fails, and keeps DIR/logs for a post-mortem.

* with ``--sshd``: an sshd in every host, in a private mount namespace of its own where DIR/home is a folder of
  that host's; keys, ``ssh_config`` and ``known_hosts`` under DIR/ssh (see :mod:`bed.sshd`).

Processes are started with ``nsenter --net=/var/run/netns/NAME``, never ``ip netns exec``: the latter also
remounts /sys in a private mount namespace, which hides the cgroup file system that slurmd checks.

Only the Python standard library is used. The Debian packages needed are installed by
scripts/system_packages.sh.

One module per part: ``common`` (errors, commands, the machine-wide lock), ``layout`` (the plan: names,
subnets, addresses, ports, and the files under DIR), ``network`` (bridge, namespaces, decoys, /etc/hosts),
``processes`` (daemons by pid and start time, the namespaces' processes), ``munge``, ``slurm``, ``sshd``, ``mpi`` (the rsh
agent and mpirun's arguments), ``lifecycle`` (build and describe, tear down) and ``cli`` (the subcommands);
scripts/testbed.py is the command.
"""
