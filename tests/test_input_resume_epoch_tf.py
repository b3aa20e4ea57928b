"""A step backup saved past the end of an epoch as long as this attempt's is refused in one line.

Relaunched into a stopped run's model dir with more workers or a larger --batch-size (a larger
global batch, so fewer steps an epoch: jobs/mnist.py's epoch is the data over the global batch)
or a smaller --steps-per-epoch, keras goes on after the saved step of the saved epoch, finds no
step left in it, and stops with "Unexpected result of `train_function` (Empty logs). This could
be due to issues in input pipeline that resulted in an empty dataset", which names no cause,
after the kit said "resuming at global step 10" (the step it placed the input at, not keras').
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from launcher import jobkit
from launcher.jobkit.context import JobKitError, TaskContext
from launcher.jobkit.position import check_backup_fits
from tests.jobkit_helpers import write_backup_at

jobkit.select_tf_keras()


def test_a_backup_within_the_epoch_or_at_its_end_fits() -> None:
    check_backup_fits((-1, -1), 5)  # no backup
    check_backup_fits((3, -1), 5)  # an epoch-end backup
    check_backup_fits((3, 4), 5)  # the epoch's last step: the next epoch comes next
    with pytest.raises(JobKitError, match=r"^the backup was saved at epoch 4 step 6, past the 5 steps an epoch has "
                                          r"now \(the global batch or steps_per_epoch changed since it was saved\)"):
        check_backup_fits((3, 5), 5)


@pytest.mark.slow
def test_fit_refuses_a_backup_past_the_shorter_epoch_instead_of_crashing_in_keras(tmp_path: Path) -> None:
    import tf_keras as keras

    model_dir = tmp_path / "model"
    write_backup_at(model_dir, 15, 20)  # saved after step 15 of 20-step epochs (global batch 3)
    x = np.random.default_rng(0).normal(size=(60, 4))
    model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    context = TaskContext("chief", 0, label="chief:0", run_id="run-2", progress_file=tmp_path / "progress.json",
                          progress_log=tmp_path / "steps.jsonl")
    with pytest.raises(JobKitError) as refused:  # a global batch of 6 now: 10 steps an epoch
        jobkit.fit(model, jobkit.ArrayInput((x, x.sum(1)), global_batch=6, seed=1), context=context,
                   model_dir=model_dir, epochs=2, global_batch_size=6, steps_per_execution=1)
    assert str(refused.value).startswith("the backup was saved at epoch 1 step 15, past the 10 steps an epoch has now")
    assert "--steps-per-epoch" in str(refused.value) and "\n" not in str(refused.value)
    assert int(model.optimizer.iterations.numpy()) == 0
