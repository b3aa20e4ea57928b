"""The batch script's part of an elastic Slurm run (``--min-tasks``). Pure: shell lines, no I/O.

The job is submitted with ``--no-kill``: when Slurm loses a node (its slurmd silent for
SlurmdTimeout, or the node set DOWN) it takes the node out of the job and srun ends the
training step ("srun: error: Node failure on n2"), but the job and its batch script go on.
After a failed step, the script asks the task driver (``python -m launcher.engines.slurm.node.task
survivors``) which nodes of that attempt Slurm still gives the job and holds usable, and:

- no node lost: the usual restart policy (``--max-restarts``);
- nodes lost, and their training tasks left >= ``min_tasks``: the ``lost`` event
  (``launcher.engines.slurm.node.batch``), then the next attempt on the nodes left, counted neither as a
  failure nor as a preemption. ``TFL_SLURM_NODES`` and the layout are narrowed, so each
  task's driver builds its TF_CONFIG from the survivors: ranks are renumbered in block order,
  and the first task left is the chief (a worker, when the chief's node was lost). The job
  resumes from the model dir, on the storage every node shares;
- fewer left: one line naming the lost nodes, and the script ends with the step's status.

A node Slurm took out of a job never returns to it, so there is no waiting for it and no
taking it back (the SSH backend's ``--elastic-wait`` and probes do not apply here).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from launcher.contract import SLURM_LAYOUT, SLURM_NODES


def elastic_srun(argv: Sequence[str], nodes: int, tasks: int) -> str:
    """The training step's srun line on the nodes left (shell variables ``start_lines`` sets)."""
    fixed = {f"--nodes={nodes}", f"--ntasks={tasks}"}
    return " ".join(['srun --nodes="$train_nodes" --ntasks="$train_tasks" --nodelist="$train_nodelist"',
                     shlex.join(a for a in argv[1:] if a not in fixed)])


def start_lines(nodes: int, tasks: int) -> list[str]:
    """Before the loop: every node of the job (``TFL_SLURM_NODES``' names)."""
    return [f"train_nodes={nodes} train_tasks={tasks}",
            f"train_nodelist=$(printf %s \"${SLURM_NODES}\" | sed 's/=[^,]*//g')",
            "lost_line="]


def check_lines(driver: Sequence[str], err_path: str) -> list[str]:
    """After a step, before its exit is noted: the nodes it lost (the launcher reads the ``lost``
    event with the exit, so it knows at once whether a resize follows)."""
    return [
        "  lost_line=",
        f"  if [ $status -ne 0 ] && [ -z \"$stopping\" ] && found=$({shlex.join([*driver, 'survivors'])} {err_path} $attempt); then",
        "    { read -r lost_line; read -r left_nodes; read -r left_layout; read -r lost_nodes; } <<< \"$found\"",
        "    note \"$lost_line\"",
        "  fi",
    ]


def resize_lines(min_tasks: int) -> list[str]:
    """The first branch of the restart policy: go on with the nodes left, or end below the minimum."""
    return [
        "  if [ -n \"$lost_line\" ]; then",
        "    read -r _ _ from to before after <<< \"$lost_line\"",
        f"    if [ $to -lt {min_tasks} ]; then",
        f"      echo \"tfl: lost node(s) $lost_nodes: $to training task(s) left, below --min-tasks {min_tasks}\" >&2; break",
        "    fi",
        f"    export {SLURM_NODES}=\"$left_nodes\" {SLURM_LAYOUT}=\"$left_layout\"",
        "    train_nodelist=$after train_tasks=$to train_nodes=$(tr , '\\n' <<< \"$after\" | wc -l)",
        "    why=\"lost node(s) $lost_nodes: resize $from -> $to training tasks on $after (not counted as a restart)\"",
    ]
