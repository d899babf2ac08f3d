"""preflight=true: the job launched as a real run would be, but instead of the recipe each host checks
its network and devices and every process takes part in one small all-reduce.

On each host, before any rank starts (runner.worker.host_agent, for a host or, with one
task per process, where the host's local rank 0 checks), in this order, stopping at the first failure:

1. the master address resolves; on hosts other than host 0, not to loopback unless every host is this
   machine (on host 0 itself a loopback master is fine: Debian maps a host's own name to 127.0.1.1);
2. a route leads there (on host 0 with a loopback master: to another host), and the interface gloo/NCCL
   will use, and why; with gloo left to itself, the address this host's name resolves to must not be
   loopback (gloo would listen there);
3. rendezvous -- env:// and tcp://: host 0 holds the port (it serves the store there) and every host
   opens a TCP connection to master:port, a refused one retried for a short while since host 0 may
   start later; file://: the init file's folder exists and is writable here;
4. the host has the devices the spec gives it.

Then every process runs :func:`collective`: init_process_group with the exact spec, an all-reduce of
rank + 1, a check of the sum, destroy_process_group, all under a short timeout. Each host's local
rank 0 prints the host's line::

    preflight node1 (tb1234h2, 10.0.0.12): master tb1234h1 -> 10.0.0.11 (not loopback) · route via lan0 ...

A failed check ends the line with ``FAILED: what — hint: what to do``, and the host (or the process)
exits 1 at once; its launcher then stops the others.
"""

# checks: each check and a host's line; host: a host's checks together, before its processes start;
# collective: every process's all-reduce, and how a host's preflight ended
