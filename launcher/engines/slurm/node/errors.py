"""The Slurm backend's own faults (one line each: what was wrong and the fix)."""

from __future__ import annotations

from launcher.errors import LaunchError


class SlurmError(LaunchError):
    """A Slurm command failed or Slurm told us something we cannot work with (a launch fault:
    the supervisor records the run as failed with this line)."""


class SlurmLayoutError(SlurmError):
    """The allocation's nodes or tasks cannot be turned into a TF_CONFIG."""
