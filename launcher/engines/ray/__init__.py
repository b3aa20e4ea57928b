"""The Ray backend: a run's tasks as Ray actors, one per bundle of the run's placement group.

Launcher side only: ``connect`` (import Ray lazily, connect, the one-line error without the
extra), ``group`` (placement group, actors, ports, the cluster's feasibility), ``relay`` (each
task's output and progress to its files on this machine), ``backend`` (the protocol),
``recorded`` (status, stop and clean-up of a recorded run, from the record alone). What runs
on the nodes is ``launcher.ray.runner`` (node side, stdlib only), shipped with the job kit.
"""
