"""The Slurm engine's node side: what every ``srun`` step of tfl's batch script runs on a node.

``task`` (the driver: nodes, survivors, training, evaluator), ``batch`` (the plan's SlurmJobPlan,
the run dir's slurm/ files and events format), ``nodes`` (node order, NodeAddr, ports,
TF_CONFIG), ``errors``. Standard library only, plus ``launcher.contract``, ``launcher.errors``
and ``launcher.tasklog`` (an import-linter contract keeps it so): importing the launcher side
(``launcher.engines.slurm``) would load the launcher's stack on every node.
"""
