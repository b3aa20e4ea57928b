"""What a preempted task left to say: the agreed step, from its last progress record.

A training task that got a notice (SIGTERM) saves the agreed checkpoint and exits
``contract.PREEMPTED_EXIT_CODE``; its last progress record has phase
``contract.PREEMPTED_PHASE`` and the agreed step as ``global_step``. The progress file is on
this machine whatever ran the task (an SSH agent mirrors it before it reports the exit), so
the supervisor, ``tfl status`` and the summary read it here. A kit that does not write that
record still gets "preempted", without the step.
"""

from __future__ import annotations

import json

from launcher.contract import PREEMPTED_EXIT_CODE, PREEMPTED_PHASE, ProgressRecord
from launcher.runstore import RunRecord
from launcher.states import TaskState
from launcher.tasks import TaskId


def agreed_step(progress_path: str) -> int | None:
    """The step a preempted task saved at, when its last progress record says so."""
    try:
        with open(progress_path) as f:
            progress = ProgressRecord.from_dict(json.load(f))
    except (OSError, ValueError):
        return None
    if progress is None or progress.phase != PREEMPTED_PHASE:
        return None
    return progress.global_step


def preemption_reason(progress_path: str) -> str:
    """The reason recorded for a task that exited PREEMPTED_EXIT_CODE."""
    step = agreed_step(progress_path)
    return "preempted: saved the agreed checkpoint" + ("" if step is None else f" at step {step}")


def saved_note(record: RunRecord, grace: float) -> str:
    """After a stop with notice: which training tasks saved the agreed checkpoint (``""``: none did)."""
    training = [t for t in record.tasks if TaskId.parse(t.task).is_training]
    saved = [t for t in training if t.state == TaskState.PREEMPTED]
    if not saved:
        return ""
    steps = {agreed_step(t.progress_path) for t in saved} - {None}
    at = f" at step {steps.pop()}" if len(steps) == 1 else ""
    if len(saved) == len(training):
        return f"; every training task saved the agreed checkpoint{at}"
    return (f"; {len(saved)} of {len(training)} training tasks saved the agreed checkpoint{at}, the others not within "
            f"the {grace:g} s grace (--grace-period)")


def ended_state(code: int | None, otherwise: TaskState) -> TaskState:
    """A task's state once it exited with ``code``: saved on a notice, succeeded, or ``otherwise``."""
    if code == PREEMPTED_EXIT_CODE:
        return TaskState.PREEMPTED
    return TaskState.SUCCEEDED if code == 0 else otherwise
