"""A Keras 3 model handed to the kit is refused in one line that names the fix, before any training
(it used to fail inside `fit` on a tf_keras attribute, with a traceback naming neither)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from launcher import jobkit
from launcher.jobkit.context import TaskContext

jobkit.select_tf_keras()

pytestmark = pytest.mark.slow


def keras3_model() -> Any:
    import keras  # Keras 3, whatever TF_USE_LEGACY_KERAS says: what a job's `import keras` gets

    model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def context(tmp_path: Path) -> TaskContext:
    return TaskContext("chief", 0, label="chief:0", run_id="run-1", progress_file=tmp_path / "progress.json",
                       progress_log=tmp_path / "steps.jsonl")


def test_fit_refuses_a_keras3_model_naming_tf_keras(tmp_path: Path) -> None:
    x = np.zeros((16, 4), "float32")
    train = jobkit.ArrayInput((x, x[:, 0]), global_batch=4, seed=0)
    with pytest.raises(jobkit.JobKitError, match=r"Keras 3 model .*import tf_keras as keras") as caught:
        jobkit.fit(keras3_model(), train, context=context(tmp_path), model_dir=tmp_path / "model", epochs=1,
                   global_batch_size=4)
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "model").exists()  # refused before the kit wrote anything


def test_the_evaluator_refuses_a_keras3_model_and_a_non_model(tmp_path: Path) -> None:
    import tensorflow as tf

    test = tf.data.Dataset.from_tensor_slices((np.zeros((4, 4)), np.zeros(4))).batch(2)
    with pytest.raises(jobkit.JobKitError, match=r"run_evaluator got a Keras 3 model"):
        jobkit.run_evaluator(keras3_model(), test, context=context(tmp_path), model_dir=tmp_path / "model",
                             idle_timeout_s=1)
    with pytest.raises(jobkit.JobKitError, match=r"run_evaluator got builtins\.NoneType, not a model"):
        jobkit.run_evaluator(None, test, context=context(tmp_path), model_dir=tmp_path / "model", idle_timeout_s=1)


def test_the_run_summary_answers_the_kits_refusal_with_the_keras3_fix(tmp_path: Path) -> None:
    from launcher.views.diagnosis import KERAS3_FIX, known_fix

    x = np.zeros((16, 4), "float32")
    with pytest.raises(jobkit.JobKitError) as caught:
        jobkit.fit(keras3_model(), jobkit.ArrayInput((x, x[:, 0]), global_batch=4, seed=0), context=context(tmp_path),
                   model_dir=tmp_path / "model", epochs=1, global_batch_size=4)
    uncaught = ["Traceback (most recent call last):", f"launcher.jobkit.context.JobKitError: {caught.value}"]
    caught_by_the_job = [f"myjob: {caught.value}"]  # a job that catches JobKitError around its main
    assert known_fix(uncaught) == KERAS3_FIX and known_fix(caught_by_the_job) == KERAS3_FIX
    assert known_fix(["launcher.jobkit.context.JobKitError: the global batch (9 examples) is larger"]) is None
