"""launcher=slurm: sbatch from a login node, or an srun step inside an allocation (runner.launchers.slurm.launcher).
Its modules: job (Slurm's commands and a job's states, the data model: a leaf), follow (following a submitted job to
its end), array (a sweep as job arrays), launcher (SlurmLauncher)."""
