"""launcher=slurm: sbatch from a login node, or an srun step inside an allocation (runner.launchers.slurm.launcher).
Its modules: job (Slurm's commands and a job's states, the data model: a leaf), follow (following a submitted job to
its end), array (a sweep as job arrays), rules (its options, the job and the allocation checked), step (the srun
step as a request), sbatch (the batch script as a request), launcher (SlurmLauncher: builds them, submits, follows)."""
