"""A notice before an attempt's first step ended leaves at once: nothing was trained since the restore.

`tfl stop` during the replay of a tf.data input at a high step (the first call of the train
function reads and drops every batch before the resume step: minutes) used to wait for an
agreed step that could not come before the grace period: `tfl stop` took the whole 30 s and
every task ended by SIGKILL (exit -9). Nothing had been trained since the backup was restored,
so there is nothing to save: the task now leaves at once with 170, as it does before `fit`.
No TensorFlow: the task is the kit's notice module, blocked in a C call as a replaying task is.
"""

from __future__ import annotations

from pathlib import Path

from launcher.contract import PREEMPTED_EXIT_CODE
from tests.test_jobkit_preemption import run_with_notice


def test_a_notice_before_the_first_step_ended_exits_170_at_once(tmp_path: Path) -> None:
    code, out, _ = run_with_notice(tmp_path, setup="""
        notice.FIRST_CALLS_S = 3.0  # the guard's wait for a first call (60 s): what the task did before
        notice.training_begins()    # inside fit; the first call is replaying the input: no step has ended
    """)
    assert code == PREEMPTED_EXIT_CODE, out
    assert ("preemption notice (SIGTERM) before this attempt's first step ended (nothing trained since it began: "
            "the input's replay, or the first call's tracing); nothing to save, exiting 170") in out
    assert "without a checkpoint" not in out and "never" not in out  # not the guard's end after FIRST_CALLS_S


def test_after_a_step_the_notice_still_waits_for_the_agreed_step(tmp_path: Path) -> None:
    code, out, _ = run_with_notice(tmp_path, setup="""
        notice.FIRST_CALLS_S = 1.0
        notice.training_begins()
        notice.step_done()  # a step was trained: only an agreed save may end the task with 170
    """)
    assert code != PREEMPTED_EXIT_CODE and "stopping without a checkpoint" in out, out
