"""The Slurm backend, the launcher side: a run as one Slurm job (see backend.py).

Slurm's code lives in two packages, split by where it runs: here the launcher side behind
the backend protocol (``backend``: prepare, start, poll, signal; ``job``: sbatch or bash in
an allocation, scancel; ``outcome``: each task's exit from the script's events; ``recorded``:
status and stop from the record). ``launcher/slurm/`` holds the description block, the
planner and batch script, and what runs on the nodes (stdlib only): see its docstring.
"""
