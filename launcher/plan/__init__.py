"""Plan: a description into a frozen, printable ``LaunchPlan`` (``launch_plan``), built (``build``) by its kind's planner
(``cluster_planner`` here; an engine's own under ``launcher/engines/<engine>/plan.py``), with TF_CONFIG (``tfconfig``),
the run's options as data (``run_options``), shared-storage rules (``storage``) and an elastic run's resizes
(``resize``). Pure: nothing here starts a process or reaches a host."""
