"""TFRecordInput's record counts make the model dir 0700, as the kit makes model dirs.

`prepare` writes ``input_records.json`` before `fit` makes the model dir; it made the dir (and any
missing parent) with mkdir's default mode, 0755 under the usual umask: a run's checkpoints and
backups listable by every account on a shared machine, where fit makes it 0700 (layout.make_private_dirs).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_input_records_unit_tf import source, write_shards

pytestmark = pytest.mark.slow


def test_the_counts_make_the_model_dir_private(tmp_path: Path) -> None:
    import tensorflow as tf

    model_dir = tmp_path / "runs" / "model"
    source(tf, write_shards(tf, tmp_path / "shards"), model_dir).prepare(model_dir, is_chief=True)
    modes = [oct(p.stat().st_mode & 0o777) for p in (model_dir.parent, model_dir, model_dir / "input_records.json")]
    assert modes == ["0o700", "0o700", "0o600"]
