"""Where a process runs (plain host, Slurm, MPI, torchrun): one small class each, the only readers of their variables."""
