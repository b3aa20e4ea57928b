"""A replayed tf.data pipeline that draws other batches in every process says so at the resume.

A resume reaches step k of a plain pipeline by `skip(k)`. A shuffle without any seed (no op
seed, no global seed) or a random op without one is seeded afresh in every process, so the
replayed batches are not the ones the interrupted attempt trained on. The kit used to call such
a resume exact ("the input replays the 25 batches trained before") and lose exactness without
a word; it now says which part draws other batches and the fix, and does not call it exact.
The first test shows, in two processes, that the batches do differ; the others that the kit
tells these pipelines from the ones it can replay exactly.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from launcher import jobkit
from launcher.jobkit.position import input_stream, say_where_the_input_starts

jobkit.select_tf_keras()

pytestmark = pytest.mark.slow

BACKUP = (2, 4)  # epoch 3 step 5 of 10: global step 25 comes next
REPLAYED_FIRST_BATCH = """
import json, sys
import tensorflow as tf
from launcher.jobkit.position import input_stream
data = tf.data.Dataset.range(100).shuffle(100).batch(4)
print(json.dumps(next(iter(input_stream(data, 10, (2, 4)).dataset)).numpy().tolist()))
"""


def pipelines() -> dict[str, Any]:
    import tensorflow as tf

    base = tf.data.Dataset.range(100)
    any_order = tf.data.Options()
    any_order.deterministic = False
    return {
        "unseeded shuffle": base.shuffle(100).batch(4),
        "unseeded random map": base.map(lambda v: v + tf.random.uniform([], 0, 9, tf.int64)).batch(4),
        "out-of-order map": base.map(lambda v: v * 2, num_parallel_calls=2, deterministic=False).batch(4),
        "unseeded mix": tf.data.Dataset.sample_from_datasets([base, base.map(lambda v: -v)]).batch(4),
        "out-of-order options": base.map(lambda v: v * 2, num_parallel_calls=2).batch(4).with_options(any_order),
        "seeded shuffle": base.shuffle(100, seed=1).batch(4),
        "seeded mix": tf.data.Dataset.sample_from_datasets([base, base.map(lambda v: -v)], seed=2).batch(4),
        "seeded random map": base.map(lambda v: v + tf.random.uniform([], 0, 9, tf.int64, seed=3)).batch(4),
        "filter and ordered map": base.filter(lambda v: v % 3 > 0).map(lambda v: v, num_parallel_calls=2).batch(4),
    }


def test_an_unseeded_shuffle_replays_other_batches_in_another_process() -> None:
    firsts = [json.loads(subprocess.run([sys.executable, "-c", REPLAYED_FIRST_BATCH], capture_output=True, text=True,
                                        check=True, timeout=300).stdout) for _ in range(2)]
    assert firsts[0] != firsts[1]  # what the kit must not call exact (1 chance in ~4 million of equal)


@pytest.mark.parametrize("name, says", [
    ("unseeded shuffle", "a shuffle without a seed (ShuffleDatasetV3)"),
    ("unseeded random map", "a random op without a seed (RandomUniformInt)"),
    ("out-of-order map", "a parallel stage with deterministic=False (ParallelMapDatasetV2)"),
    ("unseeded mix", "a random draw (Dataset.random, sample_from_datasets) without a seed (RandomDataset)"),
    ("out-of-order options", "a parallel stage under tf.data.Options(deterministic=False)"),
])
def test_a_replay_that_draws_other_batches_is_not_called_exact(name: str, says: str,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    stream = input_stream(pipelines()[name], 10, BACKUP)
    say_where_the_input_starts(stream, None)
    line = capsys.readouterr().out.strip()
    assert (stream.start, stream.replayed, stream.exact) == (25, True, False)
    assert stream.differs == says
    assert line.startswith(f"jobkit: resuming at global step 25: the input replays the 25 batches trained before, "
                           f"but not exactly: {says} draws other batches in every process; give each shuffle"), line
    assert "\n" not in line and "keras.utils.set_random_seed" in line


@pytest.mark.parametrize("name", ["seeded shuffle", "seeded random map", "seeded mix", "filter and ordered map"])
def test_a_replay_of_a_seeded_ordered_pipeline_stays_exact(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    stream = input_stream(pipelines()[name], 10, BACKUP)
    say_where_the_input_starts(stream, None)
    assert (stream.start, stream.replayed, stream.exact, stream.differs) == (25, True, True, "")
    assert capsys.readouterr().out.startswith("jobkit: resuming at global step 25: the input replays the 25 batches "
                                              "trained before (a tf.data pipeline")


def test_a_global_seed_makes_an_unseeded_shuffle_replay_exactly() -> None:
    import tensorflow as tf

    tf.random.set_seed(7)  # keras.utils.set_random_seed does this: op seeds follow from it
    try:
        stream = input_stream(tf.data.Dataset.range(100).shuffle(100).batch(4), 10, BACKUP)
    finally:
        tf.random.set_seed(None)
    assert (stream.exact, stream.differs) == (True, "")
