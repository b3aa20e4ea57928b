"""The Ray engine, whole: a run's tasks as Ray actors, one per bundle of the run's placement group.

Launcher side: ``settings`` (the ``ray`` block, pydantic), ``plan`` (a Ray ``LaunchPlan`` and its
``RayUnit``; stdlib), ``connect`` (import Ray lazily, connect, the one-line error without the
extra), ``group`` (placement group, actors, ports, the cluster's feasibility), ``relay`` (each
task's output and progress to its files on this machine), ``backend`` (the protocol),
``recorded`` (status, stop and clean-up of a recorded run, from the record alone).

Node side, ``node/``: ``node.runner``, the actor each task is (stdlib only), shipped with the job
kit as the actors' ``py_modules``. This file imports nothing (it is shipped too).
"""
