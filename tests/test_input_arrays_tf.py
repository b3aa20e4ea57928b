"""ArrayInput refuses what is not a tuple of arrays in one line that says what to pass. Before, a
single array counted its columns as arrays (`len` of each row: a "global batch larger than the
training arrays (8 examples)" for 64 rows), a dict counted its keys' letters, a tf.data.Dataset
its elements as arrays, and a lone ndarray died on NumPy's "truth value of an array is ambiguous"."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from launcher import jobkit

jobkit.select_tf_keras()

pytestmark = pytest.mark.slow

X = np.arange(64 * 8, dtype="float32").reshape(64, 8)
Y = np.arange(64, dtype="int64")
FIX = r"pass a tuple of arrays with one row per example: \(x_train, y_train\), or \(x_train,\) for one"


def dataset() -> Any:
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices((X, Y))


@pytest.mark.parametrize(("arrays", "said"), [
    (X, r"ArrayInput got a ndarray of shape \(64, 8\), not a tuple of arrays; " + FIX),
    ({"x": X, "y": Y}, r"ArrayInput got a dict, not a tuple of arrays; " + FIX),
    ((), r"ArrayInput got no array; " + FIX),
    ((X, 3), r"ArrayInput's array 1 is a scalar \(3\), not rows; " + FIX),
], ids=["one array", "a dict", "nothing", "a scalar"])
def test_what_is_not_a_tuple_of_arrays_is_refused_naming_the_fix(arrays: Any, said: str) -> None:
    with pytest.raises(jobkit.JobKitError, match=f"^{said}$"):
        jobkit.ArrayInput(arrays, global_batch=16, seed=0)


@pytest.mark.parametrize("wrap", [lambda d: d, lambda d: (d,)], ids=["the dataset", "a tuple holding it"])
def test_a_dataset_is_sent_to_fit_instead(wrap: Any) -> None:
    with pytest.raises(jobkit.JobKitError, match=r"not a tf\.data\.Dataset: give the dataset to jobkit\.fit itself"):
        jobkit.ArrayInput(wrap(dataset()), global_batch=16, seed=0)


def test_a_list_and_a_one_array_tuple_still_work() -> None:
    assert jobkit.ArrayInput([X, Y], global_batch=16, seed=0).steps_per_epoch == 4
    alone = jobkit.ArrayInput((X,), global_batch=16, seed=0)
    first = next(iter(alone.replica_batches(0, 0, 1, 1)))
    assert first.shape == (16, 8)
    assert sorted(np.asarray(first)[:, 0] // 8) == sorted(set(np.asarray(first)[:, 0] // 8))  # 16 distinct rows
