"""The Slurm backend: a run as one Slurm job (see backend.py)."""
