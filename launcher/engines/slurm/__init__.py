"""The Slurm engine, whole: a run as one Slurm job (see backend.py).

Launcher side, behind the engine protocol: ``settings`` (the ``slurm`` description block,
pydantic), ``plan`` (a Slurm LaunchPlan and its dry-run text), ``script`` and ``resize`` (the
batch script and srun lines, pure), ``jobstate`` (squeue/sacct/scontrol parsing), ``backend``
(prepare, start, poll, signal), ``job`` (sbatch or bash in an allocation, scancel), ``outcome``
(each task's exit from the script's events), ``recorded`` (status and stop from the record).

Node side, ``node/``: what each ``srun`` step runs (``node.task``, as ``python -m
launcher.engines.slurm.node.task``) and what it reads (``node.batch``, ``node.nodes``,
``node.errors``); stdlib only (plus ``launcher.contract``, ``launcher.errors``,
``launcher.tasklog``), so a node never loads the launcher's stack. This file imports nothing.
"""
