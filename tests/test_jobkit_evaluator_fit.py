"""A job without an evaluator branch, launched with --evaluator, calls jobkit.fit in its evaluator
task: the kit refuses it there in one line that names the fix. Before, the evaluator trained a
model of its own, alone (one replica, into a scratch dir), printed `epoch N/M loss=...` lines of
its own, evaluated nothing, and the run succeeded as if it had an evaluator."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from launcher import jobkit
from launcher.jobkit.context import TaskContext

jobkit.select_tf_keras()

pytestmark = pytest.mark.slow


def test_fit_in_the_evaluator_task_is_refused_before_training(tmp_path: Path) -> None:
    import tf_keras as keras

    x = np.zeros((16, 4), "float32")
    train = jobkit.ArrayInput((x, x[:, 0]), global_batch=4, seed=0)
    model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    evaluator = TaskContext("evaluator", 0, cluster={"chief": ("h:1",), "worker": ("h:2",)}, label="evaluator:0",
                            run_id="run-1", progress_file=tmp_path / "progress.json", progress_log=tmp_path / "steps.jsonl")
    with pytest.raises(jobkit.JobKitError, match=r"^jobkit\.fit was called in the evaluator task \(evaluator:0\), which "
                                                 r"does not train; .*jobkit\.run_evaluator.*or launch it without "
                                                 r"--evaluator$"):
        jobkit.fit(model, train, context=evaluator, model_dir=tmp_path / "model", epochs=1, global_batch_size=4)
    assert int(model.optimizer.iterations.numpy()) == 0
    assert not (tmp_path / "progress.json").exists() and not (tmp_path / "model").exists()
