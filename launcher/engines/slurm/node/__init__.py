"""Slurm, the parts that run on the nodes or render without the backend.

Slurm's code lives in two packages, split by where it runs and what it may import:

- ``launcher/slurm/`` (here): the ``slurm`` description block (``settings``, pydantic), its
  planner (``plan``) and batch script (``script``), node order and TF_CONFIG (``nodes``), the
  run dir's files and events format (``batch``), the parsing of squeue/sacct/scontrol
  (``jobstate``), and ``task``, the driver every ``srun`` step runs on a node. What runs on
  the nodes (``task``, ``nodes``, ``batch``, ``errors``) imports only the standard library
  and ``launcher.contract``: importing ``launcher.backends`` would load the launcher's stack
  on every node.
- ``launcher/backends/slurm/``: the launcher side, behind the backend protocol (submit or
  run the script, follow the tasks, status, stop).

Every engine with a node side follows this split (``launcher/<engine>/`` for what runs on
the nodes, ``launcher/backends/<engine>/`` for the launcher); docs/architecture.md maps both.
"""
