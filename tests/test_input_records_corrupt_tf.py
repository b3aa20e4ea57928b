"""Corrupt TFRecord files are named in one line with the fix, not left to a TensorFlow traceback:
a record whose checksum fails (found when training reads it: `fit` names its file and record),
a GZIP file cut short or not GZIP at all (refused when the input is made), and a GZIP file named
as a plain one. Before, the first raised DataLossError out of fit's own diagnosis, the second a
DataLossError from the record count, the third said "cut short ... write the file again"."""

from __future__ import annotations

import gzip
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from launcher import jobkit
from launcher.jobkit.context import JobKitError, TaskContext
from tests.test_input_records_unit_tf import write_shards

jobkit.select_tf_keras()

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tf() -> Iterator[Any]:
    import tensorflow

    yield tensorflow


def spoil_record(path: Path, record: int) -> None:
    """Flip a byte inside the data of `record`: its length is whole, its checksum fails."""
    data = bytearray(path.read_bytes())
    offset = 0
    for _ in range(record):
        offset += 12 + struct.unpack("<Q", data[offset:offset + 8])[0] + 4
    data[offset + 12 + 3] ^= 0xFF
    path.write_bytes(bytes(data))


def source(tf: Any, directory: Path, model_dir: Path) -> Any:
    def parse(record: Any) -> Any:
        return tf.io.parse_single_example(record, {"v": tf.io.FixedLenFeature([], tf.int64)})["v"]

    def batch_fn(values: Any) -> Any:
        return tf.cast(values[:, None], tf.float32) / 100.0, values % 3

    return jobkit.TFRecordInput(directory, model_dir=model_dir, parse=parse, global_batch=4, seed=9, window=4,
                                batch_fn=batch_fn)


def test_fit_names_the_file_and_record_whose_checksum_fails(tf: Any, tmp_path: Path) -> None:
    import tf_keras as keras

    shards = write_shards(tf, tmp_path / "shards")
    spoil_record(shards / "part-2.tfrecord", 3)
    train = source(tf, shards, tmp_path / "model")
    model = keras.Sequential([keras.Input(shape=(1,)), keras.layers.Dense(3)])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    context = TaskContext("chief", 0, label="chief:0", run_id="run-1", progress_file=tmp_path / "progress.json",
                          progress_log=tmp_path / "steps.jsonl")
    with pytest.raises(JobKitError) as caught:  # a pass holds every record: the spoilt one is read in epoch 1
        jobkit.fit(model, train, context=context, model_dir=tmp_path / "model", epochs=2, global_batch_size=4,
                   steps_per_execution=1)
    said = str(caught.value)
    assert said.startswith(f"{shards / 'part-2.tfrecord'}: record 3 (0-based) is corrupt (corrupted record at ")
    assert said.endswith("write the file again, or remove it") and "\n" not in said and "Op:" not in said


def test_a_gzip_file_cut_short_or_not_gzip_is_refused_when_the_input_is_made(tf: Any, tmp_path: Path) -> None:
    shards = write_shards(tf, tmp_path / "shards", gzip=True)
    whole = (shards / "part-1.tfrecord.gz").read_bytes()
    (shards / "part-1.tfrecord.gz").write_bytes(whole[:-20])
    with pytest.raises(JobKitError, match=r"part-1\.tfrecord\.gz: not a whole GZIP TFRecord file \(.*\); write the file "
                                          r"again$"):
        source(tf, shards, tmp_path / "m1")
    (shards / "part-1.tfrecord.gz").write_bytes(b"plain text, not GZIP\n" * 8)
    with pytest.raises(JobKitError, match=r"part-1\.tfrecord\.gz: not a whole GZIP TFRecord file \(inflate\(\) failed"):
        source(tf, shards, tmp_path / "m2")


def test_a_gzip_file_named_as_a_plain_one_is_told_its_name(tf: Any, tmp_path: Path) -> None:
    shards = write_shards(tf, tmp_path / "shards")
    (shards / "part-0.tfrecord").write_bytes(gzip.compress((shards / "part-0.tfrecord").read_bytes()))
    with pytest.raises(JobKitError, match=r"part-0\.tfrecord: cut short in record 0 \(.*\); it starts as GZIP does: "
                                          r"a compressed file is named part-0\.tfrecord\.gz"):
        source(tf, shards, tmp_path / "model")
