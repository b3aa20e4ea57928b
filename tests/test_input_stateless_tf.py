"""An `augment` or `batch_fn` with a stateful random op is refused before training, in one line
that names it and the fix. Before, it was taken: every restart drew other random numbers, so the
batches after a resume differed from an uninterrupted run's, silently (docs/input.md promises
"the batch is the same, bit for bit, after any restart" to stateless ops only)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from launcher import jobkit

jobkit.select_tf_keras()

pytestmark = pytest.mark.slow

X = np.random.default_rng(3).normal(size=(32, 4)).astype("float32")
Y = np.arange(32, dtype="int64")


def first_batch(augment: Any = None, batch_fn: Any = None) -> Any:
    source = jobkit.ArrayInput((X, Y), global_batch=8, seed=5, augment=augment, batch_fn=batch_fn)
    return next(iter(source.replica_batches(0, 0, 1, 1)))


def noisy(example: Any, seed: Any) -> Any:
    import tensorflow as tf

    x, y = example
    return x + tf.random.uniform([4]), y


def flipped(example: Any, seed: Any) -> Any:
    import tensorflow as tf

    x, y = example
    return tf.image.random_flip_left_right(tf.reshape(x, [2, 2, 1])), y


def in_a_cond(example: Any, seed: Any) -> Any:
    import tensorflow as tf

    x, y = example
    return tf.cond(y > 3, lambda: x + tf.random.normal([4]), lambda: x), y


@pytest.mark.parametrize(("augment", "op"), [(noisy, "RandomUniform"), (flipped, "RandomUniform"),
                                             (in_a_cond, "RandomStandardNormal")],
                         ids=["tf.random.uniform", "tf.image.random_flip", "inside a tf.cond"])
def test_an_augment_with_a_stateful_random_op_is_refused(augment: Any, op: str) -> None:
    with pytest.raises(jobkit.JobKitError, match=rf"^augment uses stateful random ops \({op}\), so its examples would "
                                                 r"differ after a restart; use the stateless ones .*tf\.random\.stateless_"):
        first_batch(augment)


def test_a_random_generator_is_refused_too() -> None:
    import tensorflow as tf

    generator = tf.random.Generator.from_seed(1)

    def jitter(example: Any, seed: Any) -> Any:
        x, y = example
        return x + generator.normal([4]), y

    with pytest.raises(jobkit.JobKitError, match=r"^augment uses stateful random ops \(Rng"):
        first_batch(jitter)


def test_a_batch_fn_with_a_stateful_random_op_is_refused() -> None:
    import tensorflow as tf

    with pytest.raises(jobkit.JobKitError, match=r"^batch_fn uses stateful random ops \(RandomStandardNormal\)"):
        first_batch(batch_fn=lambda x, y: (x + tf.random.normal(tf.shape(x)), y))


def test_stateless_ops_are_taken_and_give_the_same_batch_every_time() -> None:
    import tensorflow as tf

    def jitter(example: Any, seed: Any) -> Any:
        x, y = example
        flip = tf.image.stateless_random_flip_left_right(tf.reshape(x, [2, 2, 1]), seed)
        return tf.reshape(flip, [4]) + tf.random.stateless_normal([4], seed), y

    first, again = first_batch(jitter), first_batch(jitter)
    assert np.array_equal(first[0], again[0]) and not np.array_equal(first[0], X[np.asarray(first[1])])
