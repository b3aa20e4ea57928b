"""A TFRecordInput that finds no shard says why: files named otherwise (TensorFlow's tutorials
write `*.tfrecords`, Kaggle `*.tfrec`) are named with the fix, and a directory that is not there
is told as such. Before, both read "has no *.tfrecord file; write the shards there first
(jobs/prepare_fashion_records.py)", beside the user's shards."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher import jobkit
from launcher.jobkit.context import JobKitError

jobkit.select_tf_keras()

pytestmark = pytest.mark.slow


def make(directory: Path, model_dir: Path) -> None:
    jobkit.TFRecordInput(directory, model_dir=model_dir, parse=lambda r: r, global_batch=1, seed=0)


def test_shards_named_otherwise_are_named_with_the_fix(tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    shards.mkdir()
    for name in ("part-0.tfrecords", "part-1.tfrecords", "part-2.tfrec", "part-3.tfrecords", "README"):
        (shards / name).write_bytes(b"x")
    with pytest.raises(JobKitError, match=r"shards has no \*\.tfrecord \(or \*\.tfrecord\.gz\) file but part-0\.tfrecords, "
                                          r"part-1\.tfrecords, part-2\.tfrec and 1 more; name the shards \*\.tfrecord "
                                          r"\(or \*\.tfrecord\.gz when compressed\)$"):
        make(shards, tmp_path / "model")


def test_a_directory_that_is_not_there_is_told_as_such(tmp_path: Path) -> None:
    with pytest.raises(JobKitError, match=r"nowhere has no \*\.tfrecord \(or \*\.tfrecord\.gz\) file: it is not a "
                                          r"directory; give the directory that holds the shards$"):
        make(tmp_path / "nowhere", tmp_path / "model")
    (tmp_path / "empty").mkdir()
    with pytest.raises(JobKitError, match=r"empty has no \*\.tfrecord .*; write the shards there first"):
        make(tmp_path / "empty", tmp_path / "model")
