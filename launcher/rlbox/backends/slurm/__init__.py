"""The Slurm backend: `rlbox run --backend slurm --nodes N [--partition P] [--time T]`.

``plan`` (pure: the batch script, the sbatch line, the judgements of Slurm's answers) and
``execute`` (sbatch, wait for the allocation, the hosts path on exactly its nodes, scancel)."""
