"""TFRecordInput with real TensorFlow (in this process): position-addressed reading of shards,
the record counts kept beside the run, and bad shards refused in one line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from launcher.jobkit.context import JobKitError

pytestmark = pytest.mark.slow

COUNTS = (7, 11, 5, 9)  # 32 records in 4 files of different lengths
B = 6


@pytest.fixture(scope="module")
def tf() -> Iterator[Any]:
    import tensorflow

    yield tensorflow


def write_shards(tf: Any, directory: Path, *, gzip: bool = False, bad: tuple[int, int] | None = None) -> Path:
    """Record r of file f holds the int64 100 f + r (an Example), except `bad` = (f, r): garbage."""
    directory.mkdir(parents=True)
    options = tf.io.TFRecordOptions(compression_type="GZIP") if gzip else None
    for f, count in enumerate(COUNTS):
        with tf.io.TFRecordWriter(str(directory / f"part-{f}.tfrecord{'.gz' if gzip else ''}"), options) as writer:
            for r in range(count):
                value = tf.train.Feature(int64_list=tf.train.Int64List(value=[100 * f + r]))
                example = tf.train.Example(features=tf.train.Features(feature={"v": value})).SerializeToString()
                writer.write(b"\x00not an example" if (f, r) == bad else example)
    return directory


def parse(tf: Any) -> Any:
    return lambda record: tf.io.parse_single_example(record, {"v": tf.io.FixedLenFeature([], tf.int64)})["v"]


def source(tf: Any, directory: Path, model_dir: Path, window: int = 4) -> Any:
    from launcher.jobkit.records import TFRecordInput

    return TFRecordInput(directory, model_dir=model_dir, parse=parse(tf), global_batch=B, seed=9, window=window)


def batches(src: Any, start: int, count: int, pipeline: int = 0, pipelines: int = 1) -> list[list[int]]:
    return [np.asarray(b).tolist() for b in src.replica_batches(start, pipeline, pipelines, 1).take(count)]


@pytest.mark.parametrize("gzip", [False, True])
def test_a_stream_started_at_step_k_is_the_uninterrupted_streams_step_k(tf: Any, tmp_path: Path, gzip: bool) -> None:
    src = source(tf, write_shards(tf, tmp_path / "shards", gzip=gzip), tmp_path / "model")
    assert src.batch.examples == 32 and src.steps_per_epoch == 5
    whole = batches(src, 0, 16)  # 96 examples: three passes
    passes = np.concatenate(whole).reshape(3, 32)
    every = sorted(100 * f + r for f, count in enumerate(COUNTS) for r in range(count))
    for one in passes:
        assert sorted(one.tolist()) == every
    assert passes[0].tolist() != passes[1].tolist()
    for start in (1, 3, 5, 6, 11):  # 5 and 11 straddle a pass
        assert batches(src, start, 16 - start) == whole[start:], start
    halves = [batches(src, 4, 6, p, 2) for p in range(2)]
    assert [a + b for a, b in zip(*halves, strict=True)] == whole[4:10]
    assert ("GZIP" in src.how_it_resumes()) == gzip


def test_the_counts_are_kept_beside_the_run_and_a_changed_file_is_refused(tf: Any, tmp_path: Path) -> None:
    shards = write_shards(tf, tmp_path / "shards")
    model_dir = tmp_path / "model"
    src = source(tf, shards, model_dir)
    src.prepare(model_dir, is_chief=True)
    kept = json.loads((model_dir / "input_records.json").read_text())
    assert [s["records"] for s in kept["shards"]] == list(COUNTS)
    assert source(tf, shards, model_dir).shards == src.shards  # read back, not counted again
    (shards / "part-9.tfrecord").write_bytes((shards / "part-0.tfrecord").read_bytes())
    with pytest.raises(JobKitError, match=r"^[^\n]*changed since this run began \(new: part-9.tfrecord\)"):
        source(tf, shards, model_dir)


def test_bad_shards_are_refused_in_one_line(tf: Any, tmp_path: Path) -> None:
    shards = write_shards(tf, tmp_path / "shards")
    (shards / "part-4.tfrecord").write_bytes(b"")
    with pytest.raises(JobKitError, match=r"part-4.tfrecord holds no record"):
        source(tf, shards, tmp_path / "m1")
    (shards / "part-4.tfrecord").write_bytes((shards / "part-0.tfrecord").read_bytes()[:-3])
    with pytest.raises(JobKitError, match=r"part-4.tfrecord: cut short in record 6"):
        source(tf, shards, tmp_path / "m2")
    with pytest.raises(JobKitError, match="has no \\*.tfrecord"):
        source(tf, tmp_path / "m2", tmp_path / "m3")
    from launcher.jobkit.records import TFRecordInput

    (shards / "part-4.tfrecord").unlink()
    with pytest.raises(JobKitError, match=r"global batch \(33 examples\) is larger than"):
        TFRecordInput(shards, model_dir=tmp_path / "m4", parse=parse(tf), global_batch=33, seed=1)


def test_a_record_that_does_not_parse_is_named_by_file_and_record(tf: Any, tmp_path: Path) -> None:
    src = source(tf, write_shards(tf, tmp_path / "shards", bad=(2, 3)), tmp_path / "model")
    with pytest.raises(tf.errors.InvalidArgumentError):
        batches(src, 0, 6)
    found = src.find_unparsable(0, limit=64)
    assert found is not None and "\n" not in str(found)
    assert str(found).startswith(f"{tmp_path / 'shards' / 'part-2.tfrecord'}: record 3 (0-based) does not parse")


@pytest.mark.parametrize("gzip", [False, True])
def test_how_it_resumes_bounds_the_records_read_before_the_resume(tf: Any, tmp_path: Path, gzip: bool) -> None:
    """GZIP files were said to read "at most 16 records" (the window) before the resume's record: a GZIP
    file cannot seek, so all of the file before it is read, up to the largest file's records."""
    src = source(tf, write_shards(tf, tmp_path / "shards", gzip=gzip), tmp_path / "model", window=4)
    most = max(COUNTS) - 1 + 4 - 1 if gzip else 4
    assert f"at most {most} records before it are read" in src.how_it_resumes(), src.how_it_resumes()
    assert ("from its start" in src.how_it_resumes()) == gzip
