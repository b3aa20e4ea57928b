"""The restart policy, pure: which failure of an attempt counts, and whether the group may start again.

Policy (all-or-nothing, see ``states``): the first training task to fail stops every
other task at once (SIGTERM to its group, ``grace_period``, then SIGKILL), without waiting
for TensorFlow's own ~14 s heartbeat timeout. Then the group is restarted while restarts
are left, else the run has failed.

A training task that exits ``PREEMPTED_EXIT_CODE`` was *preempted*, not failed: it got a
notice, agreed on a step with the others and saved there, and the others are doing the
same. They get up to ``grace_period`` to leave on their own before the usual teardown; then
the group restarts without counting against ``max_restarts``, up to ``max_preemptions``
times (a run over that cap ends PREEMPTED, to be resumed). A task killed by a bare SIGTERM
without saving stays a failure. A stop with ``notice`` (the launcher's own SIGTERM) ends
the run PREEMPTED, unless ``tfl stop`` asked for it (``RunStore.stop_requested``).

The supervisor (``supervisor``) applies it; a group backend's unit (Slurm's batch script) applies the
same options itself.
"""

from __future__ import annotations

from launcher.contract import PREEMPTED_EXIT_CODE
from launcher.plan.run_options import PREEMPTION_EXIT_CODES, SupervisorConfig
from launcher.records.store import FailureRecord, RunRecord
from launcher.tasks import TaskId


def first_training_failure(record: RunRecord, preempted: bool | None = None) -> FailureRecord | None:
    """The first training task of this attempt that ended other than with 0; ``preempted``:
    only one that was (True) or was not (False) preempted."""
    return next((f for f in record.failures
                 if f.attempt == record.attempt and TaskId.parse(f.task).is_training
                 and (preempted is None or (f.exit_code == PREEMPTED_EXIT_CODE) == preempted)), None)


def may_restart(config: SupervisorConfig, failure: FailureRecord, preempted: bool, used: int, stop_requested: bool) -> bool:
    """Whether the group starts again after ``failure``: ``used`` is the restarts of its kind so far (preemption
    restarts are counted apart, against ``max_preemptions``); a stop the user asked for ends the run."""
    if stop_requested:
        return False
    if preempted:
        return used < config.max_preemptions
    if used >= config.max_restarts:
        return False
    return config.retry_on == "any" or failure.exit_code in PREEMPTION_EXIT_CODES
