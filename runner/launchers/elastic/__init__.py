"""A job that outlives its hosts (topology.min_nodes, topology.spares: runner.spec.elastic), whatever starts its
hosts' shares: the rounds the launch runs, each on the hosts that remain (rounds), and which hosts those are
(membership). launcher=ssh's rounds are ssh launches; launcher=slurm's are srun steps of one allocation."""
