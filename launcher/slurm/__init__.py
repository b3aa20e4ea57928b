"""Slurm: the ``slurm`` block of a cluster description, the sbatch script, TF_CONFIG from
Slurm's node order, and the parsing of squeue/sacct/scontrol output.

Pure modules except ``task`` (the small driver each ``srun`` step runs). The backend that
submits, follows and stops Slurm jobs builds on these.
"""

from __future__ import annotations

from typing import Any


def is_slurm_description(data: Any) -> bool:
    """Whether parsed JSON is a Slurm description (has a ``slurm`` key). Here rather than in
    settings.py: telling the two kinds of description apart needs no pydantic model."""
    return isinstance(data, dict) and "slurm" in data
