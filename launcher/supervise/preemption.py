"""What a preempted task left to say: the agreed step.

A training task that got a notice (SIGTERM) saves the agreed checkpoint and exits
``contract.PREEMPTED_EXIT_CODE``. The step is read from the task's last progress record
when it has phase ``contract.PREEMPTED_PHASE`` (the progress file is on this machine
whatever ran the task: an SSH agent mirrors it before it reports the exit), else from the
chief's ``preempted.json`` (``contract.PreemptedRecord``) in the model dir, when this
machine can read that dir. Without either it is still "preempted", without the step.

A task that got the notice before it trained anything this attempt (start-up, or its input's
replay), or in a fit whose epoch length is unknown, leaves with the same code but saved nothing: its last progress record has phase
``contract.LEFT_UNSAVED_PHASE`` and this attempt's number, and the launcher says so instead.
"""

from __future__ import annotations

import json
from pathlib import Path

from launcher.contract import (
    LEFT_UNSAVED_PHASE,
    PREEMPTED_EXIT_CODE,
    PREEMPTED_PHASE,
    ModelDirLayout,
    PreemptedRecord,
    ProgressRecord,
)
from launcher.records.states import TaskState
from launcher.records.store import RunRecord
from launcher.tasks import TaskId


def _json(path: str | Path | None) -> object:
    if path is None:
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def preempted_file(record: RunRecord) -> str | None:
    """The run's ``preempted.json``, when its model dir can be read on this machine."""
    from launcher.views.tensorboard import model_dir_of  # where the chief writes (shared storage, --model-dir, the run dir)

    where = model_dir_of(record)
    return None if where.host is not None or "://" in where.path else str(ModelDirLayout(Path(where.path)).preempted_file)


def agreed_step(progress_path: str, preempted: str | None = None, attempt: int | None = None) -> int | None:
    """The step a preempted task saved at: its last progress record's, else the chief's
    ``preempted`` record's (of ``attempt``), else None."""
    progress = ProgressRecord.from_dict(_json(progress_path))
    if progress is not None and progress.phase == PREEMPTED_PHASE:
        return progress.global_step
    chief = PreemptedRecord.from_dict(_json(preempted))
    if chief is not None and (attempt is None or chief.attempt == attempt):
        return chief.global_step
    return None


LEFT_UNSAVED = "left on the notice without saving (before training, or with the epoch length unknown); the last backup stays"


def left_unsaved(progress_path: str, attempt: int | None) -> bool:
    """Whether the task's last progress record says it left this attempt (``attempt``) without saving."""
    progress = ProgressRecord.from_dict(_json(progress_path))
    return (progress is not None and progress.phase == LEFT_UNSAVED_PHASE
            and (attempt is None or progress.attempt == attempt))


def preemption_reason(progress_path: str, preempted: str | None = None, attempt: int | None = None) -> str:
    """The reason recorded for a task that exited PREEMPTED_EXIT_CODE."""
    if left_unsaved(progress_path, attempt):
        return f"preempted: {LEFT_UNSAVED}"
    step = agreed_step(progress_path, preempted, attempt)
    return "preempted: saved the agreed checkpoint" + ("" if step is None else f" at step {step}")


def saved_note(record: RunRecord, grace: float) -> str:
    """After a stop with notice: which training tasks saved the agreed checkpoint, or left without saving
    (``""``: none did either)."""
    training = [t for t in record.tasks if TaskId.parse(t.task).is_training]
    left = [t for t in training if t.state == TaskState.PREEMPTED]
    unsaved = [t for t in left if left_unsaved(t.progress_path, record.attempt)]
    saved = [t for t in left if t not in unsaved]
    if unsaved and not saved:
        who = "every training task" if len(unsaved) == len(training) else f"{len(unsaved)} of {len(training)} training tasks"
        return f"; {who} {LEFT_UNSAVED}"
    if not saved:
        return ""
    chief = preempted_file(record)
    steps = {agreed_step(t.progress_path, chief, record.attempt) for t in saved} - {None}
    at = f" at step {steps.pop()}" if len(steps) == 1 else ""
    if unsaved:  # the rest of the group saved at a step these never reached
        return f"; {len(saved)} of {len(training)} training tasks saved the agreed checkpoint{at}, {len(unsaved)} {LEFT_UNSAVED}"
    if len(saved) == len(training):
        return f"; every training task saved the agreed checkpoint{at}"
    return (f"; {len(saved)} of {len(training)} training tasks saved the agreed checkpoint{at}, the others not within "
            f"the {grace:g} s grace (--grace-period)")


def ended_state(code: int | None, otherwise: TaskState) -> TaskState:
    """A task's state once it exited with ``code``: saved on a notice, succeeded, or ``otherwise``."""
    if code == PREEMPTED_EXIT_CODE:
        return TaskState.PREEMPTED
    return TaskState.SUCCEEDED if code == 0 else otherwise
