"""Slurm: the ``slurm`` block of a cluster description, the sbatch script, TF_CONFIG from
Slurm's node order, and the parsing of squeue/sacct/scontrol output.

Pure modules except ``task`` (the small driver each ``srun`` step runs). The backend that
submits, follows and stops Slurm jobs builds on these.
"""
