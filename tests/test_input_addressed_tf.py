"""ArrayInput with real TensorFlow (in this process): a stream started at step k is the uninterrupted
stream's step k, whatever the split; each pass is a permutation; the arrays are not graph constants."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from launcher.jobkit.context import JobKitError

pytestmark = pytest.mark.slow

N, B, SEED = 50, 12, 5  # 50 examples, batches of 12: batches straddle passes


@pytest.fixture(scope="module")
def tf() -> Iterator[Any]:
    import tensorflow

    yield tensorflow


def arrays() -> tuple[np.ndarray, np.ndarray]:
    images = np.arange(N * 3, dtype=np.uint8).reshape(N, 3)  # row i starts with 3i: its id
    return images, np.arange(N, dtype=np.int64)


def take(dataset: Any, count: int) -> list[Any]:
    out = []
    for element in dataset.take(count):
        out.append(tuple(np.asarray(t) for t in element) if isinstance(element, tuple) else np.asarray(element))
    return out


def global_batches(source: Any, start: int, count: int, pipelines: int, local: int) -> list[np.ndarray]:
    """Labels of global batches start..start+count-1, put together from every pipeline's replica shares."""
    per_pipeline = [take(source.replica_batches(start, p, pipelines, local), count * local) for p in range(pipelines)]
    batches = []
    for step in range(count):
        parts = [per_pipeline[p][step * local + j][1] for p in range(pipelines) for j in range(local)]
        batches.append(np.concatenate(parts))
    return batches


def test_a_stream_started_at_step_k_is_the_uninterrupted_streams_step_k(tf: Any) -> None:
    from launcher.jobkit.addressed import ArrayInput

    source = ArrayInput(arrays(), global_batch=B, seed=SEED)
    whole = global_batches(source, 0, 20, 1, 1)
    for start in (1, 4, 5, 13):  # 4 and 13 straddle a pass boundary
        assert [b.tolist() for b in global_batches(source, start, 20 - start, 1, 1)] == [b.tolist() for b in whole[start:]]
    for pipelines, local in ((2, 1), (1, 2), (3, 2), (2, 3), (4, 1)):
        split = global_batches(source, 3, 10, pipelines, local)
        assert [b.tolist() for b in split] == [b.tolist() for b in whole[3:13]], (pipelines, local)
    images = take(source.replica_batches(0, 0, 1, 1), 1)[0][0]
    assert (images[:, 0] == 3 * whole[0]).all()  # rows stay together: image i goes with label i


def test_each_pass_is_a_permutation_and_passes_differ(tf: Any) -> None:
    from launcher.jobkit.addressed import ArrayInput

    source = ArrayInput(arrays(), global_batch=10, seed=SEED)  # 10 divides 50: a pass is 5 batches
    labels = np.concatenate(global_batches(source, 0, 15, 1, 1))
    passes = labels.reshape(3, N)
    for one in passes:
        assert sorted(one.tolist()) == list(range(N))
    assert passes[0].tolist() != passes[1].tolist() != passes[2].tolist()
    other = np.concatenate(global_batches(ArrayInput(arrays(), global_batch=10, seed=SEED + 1), 0, 5, 1, 1))
    assert other.tolist() != passes[0].tolist()


def test_per_example_randomness_follows_the_position(tf: Any) -> None:
    from launcher.jobkit.addressed import ArrayInput

    def augment(example: Any, seed: Any) -> Any:
        image, label = example
        noise = tf.random.stateless_uniform([3], seed=seed, dtype=tf.float64)
        return tf.cast(image, tf.float64) + noise, label

    source = ArrayInput(arrays(), global_batch=B, seed=SEED, augment=augment)
    whole = take(source.replica_batches(0, 0, 1, 1), 8)
    resumed = take(source.replica_batches(5, 0, 1, 1), 3)
    for a, b in zip(whole[5:], resumed, strict=True):
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    split = take(source.replica_batches(5, 1, 2, 1), 1)[0]  # pipeline 1 of 2: the second half of step 5
    assert np.array_equal(split[0], whole[5][0][B // 2:])
    plain = take(ArrayInput(arrays(), global_batch=B, seed=SEED).replica_batches(0, 0, 1, 1), 8)
    for a, b in zip(whole, plain, strict=True):  # the same examples; the noise is in [0, 1)
        assert np.array_equal(a[1], b[1])
        delta = a[0] - b[0].astype(np.float64)
        assert ((delta >= 0) & (delta < 1)).all() and delta.std() > 0


def test_the_arrays_are_not_constants_of_the_input_graph(tf: Any) -> None:
    from launcher.jobkit.addressed import ArrayInput

    big = np.zeros((4096, 256), np.uint8)  # 1 MiB
    dataset = ArrayInput((big, np.zeros(4096, np.int64)), global_batch=64, seed=1).replica_batches(0, 0, 1, 1)
    sizes = []
    while dataset is not None:
        function = getattr(dataset, "_map_func", None)
        if function is not None:
            sizes.append(function.function.graph.as_graph_def().ByteSize())
        dataset = getattr(dataset, "_input_dataset", None)
    assert sizes and max(sizes) < 100_000, sizes


def test_bad_arrays_are_refused_in_one_line(tf: Any) -> None:
    from launcher.jobkit.addressed import ArrayInput

    images, labels = arrays()
    with pytest.raises(JobKitError, match=r"different numbers of rows \(\(50, 3\), \(49,\)\)"):
        ArrayInput((images, labels[:-1]), global_batch=B, seed=1)
    with pytest.raises(JobKitError, match=r"global batch \(51 examples\) is larger than the training arrays \(50"):
        ArrayInput((images, labels), global_batch=51, seed=1)
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope(), pytest.raises(JobKitError, match="inside strategy.scope"):
        ArrayInput((images, labels), global_batch=B, seed=1)
    halves = ArrayInput((images, labels), global_batch=B, seed=1, batch_fn=lambda x, y: (x[: B // 4], y))
    with pytest.raises(JobKitError, match=r"batches have shapes \(3, 3\); every part of a batch needs 6 examples"):
        halves.replica_batches(0, 0, 2, 1)
