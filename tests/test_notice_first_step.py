"""A notice before an attempt's first step ended leaves at once: nothing was trained since the restore.

`tfl stop` during the replay of a tf.data input at a high step (the first call of the train
function reads and drops every batch before the resume step: minutes) used to wait for an
agreed step that could not come before the grace period: `tfl stop` took the whole 30 s and
every task ended by SIGKILL (exit -9). Nothing had been trained since the backup was restored,
so there is nothing to save: the task now leaves at once with 170, as it does before `fit`.
No TensorFlow: the task is the kit's notice module, blocked in a C call as a replaying task is.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from launcher.contract import LEFT_UNSAVED_PHASE, PREEMPTED_EXIT_CODE, PREEMPTED_PHASE
from launcher.supervise.preemption import preemption_reason
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


def _left(tmp_path: Path, setup: str) -> tuple[int, str, dict[str, object]]:
    """A task of attempt 2 whose progress file holds attempt 1's agreed checkpoint at step 40."""
    progress = tmp_path / "chief-0.progress.json"
    progress.write_text(json.dumps({"task": "chief:0", "attempt": 1, "phase": PREEMPTED_PHASE, "epoch": 2, "epochs": 4,
                                    "global_step": 40, "examples_per_sec": 900.0}))
    code, out, _ = run_with_notice(tmp_path, setup=textwrap.dedent(f"""
        import dataclasses, pathlib
        context = dataclasses.replace(context, attempt=2, progress_file=pathlib.Path({str(progress)!r}))
        notice.exit_on_notice(context, "before training began")
    """) + textwrap.dedent(setup))
    return code, out, json.loads(progress.read_text())


@pytest.mark.parametrize("inside_fit", [False, True])
def test_a_task_that_leaves_before_training_says_it_saved_nothing(tmp_path: Path, inside_fit: bool) -> None:
    # Before fit, or in fit's first call (a replay): the launcher used to count the 170 as the
    # agreed checkpoint ("every training task saved the agreed checkpoint at step 40": attempt 1's step).
    code, out, record = _left(tmp_path, "notice.training_begins()" if inside_fit else "")
    assert code == PREEMPTED_EXIT_CODE, out
    assert (record["phase"], record["attempt"], record["global_step"]) == (LEFT_UNSAVED_PHASE, 2, 40)
    path = str(tmp_path / "chief-0.progress.json")
    assert preemption_reason(path, None, 2) == ("preempted: left on the notice without saving (before training, or "
                                                "with the epoch length unknown); the last backup stays")
    assert preemption_reason(path, None, 3) == "preempted: saved the agreed checkpoint"  # another attempt's record


def test_a_task_that_leaves_after_training_keeps_its_last_record(tmp_path: Path) -> None:
    code, _, record = _left(tmp_path, """
        notice.training_begins()
        notice.exit_on_notice(context, "after training ended", trained=True)
    """)
    assert code == PREEMPTED_EXIT_CODE and record["phase"] == PREEMPTED_PHASE
