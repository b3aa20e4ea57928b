"""A plain tf.data dataset whose epochs (steps_per_epoch × epochs) outlast one pass trains every
epoch it was asked for: the kit repeats it into one stream. It used to run out of data at the end
of its first pass, keras ended the training there with a warning, and the kit wrote its done
marker and said "training done" after 1 epoch of 12."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from launcher import jobkit
from launcher.jobkit.context import TaskContext
from launcher.jobkit.position import NOTHING, input_stream

jobkit.select_tf_keras()

pytestmark = pytest.mark.slow


def four_batches() -> Any:
    import tensorflow as tf

    return tf.data.Dataset.range(4)


def firsts(dataset: Any, count: int) -> list[int]:
    return [int(v) for v in dataset.take(count).as_numpy_iterator()]


def test_an_epoch_longer_than_the_data_reads_on_into_the_next_pass() -> None:
    stream = input_stream(four_batches(), 3, NOTHING)
    assert firsts(stream.dataset, 9) == [0, 1, 2, 3, 0, 1, 2, 3, 0]
    resumed = input_stream(four_batches(), 3, (1, 2))  # backed up at the end of epoch 2: step 6 comes next
    assert (resumed.start, resumed.replayed) == (6, True)
    assert firsts(resumed.dataset, 3) == [2, 3, 0]


def test_a_dataset_of_unknown_length_with_steps_per_epoch_repeats_too() -> None:
    filtered = four_batches().filter(lambda v: v >= 0)  # cardinality unknown
    assert firsts(input_stream(filtered, 3, NOTHING).dataset, 7) == [0, 1, 2, 3, 0, 1, 2]


def test_fit_trains_every_epoch_when_they_outlast_one_pass(tmp_path: Path) -> None:
    import tensorflow as tf
    import tf_keras as keras

    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, x.sum(1))).shuffle(32, seed=1).batch(8)  # 4 batches a pass
    model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    context = TaskContext("chief", 0, label="chief:0", run_id="run-1", progress_file=tmp_path / "progress.json",
                          progress_log=tmp_path / "steps.jsonl")
    history = jobkit.fit(model, data, context=context, model_dir=tmp_path / "model", epochs=3, steps_per_epoch=5,
                         global_batch_size=8, steps_per_execution=1)
    assert len(history.history["loss"]) == 3
    assert int(model.optimizer.iterations.numpy()) == 15
