"""The pure arithmetic of addressed input: global batches, replica shares, record lookup, changed shards."""

from __future__ import annotations

import pytest

from launcher.jobkit.addressing import GlobalBatch, Shard, check_same_shards, locate
from launcher.jobkit.context import JobKitError


def test_global_batch_k_holds_the_same_positions_whatever_the_split() -> None:
    batch = GlobalBatch(12, 100)
    for step in (0, 1, 8, 9, 1000):
        whole = list(range(step * 12, step * 12 + 12))
        for replicas in (1, 2, 3, 4, 6, 12):
            share = batch.share(replicas)
            split = [p for r in range(replicas)
                     for p in range(batch.first_position(step, r, replicas), batch.first_position(step, r, replicas) + share)]
            assert split == whole, (step, replicas)


def test_steps_per_epoch_and_passes() -> None:
    batch = GlobalBatch(16, 1500)
    assert batch.steps_per_epoch == 93
    assert batch.pass_and_offset(1499) == (0, 1499)
    assert batch.pass_and_offset(1500) == (1, 0)
    assert batch.pass_and_offset(93 * 16 * 1000) == divmod(93 * 16 * 1000, 1500)


@pytest.mark.parametrize(("size", "examples", "words"), [
    (65, 64, "global batch (65 examples) is larger than the data (64 examples)"),
    (0, 64, "expected at least 1"),
    (8, 0, "holds no example"),
])
def test_bad_batches_are_refused_in_one_line(size: int, examples: int, words: str) -> None:
    with pytest.raises(JobKitError, match=r"^[^\n]*$") as err:
        GlobalBatch(size, examples)
    assert words in str(err.value)


def test_a_batch_that_does_not_split_over_the_replicas_is_refused() -> None:
    with pytest.raises(JobKitError, match="cannot be split over 5 replicas"):
        GlobalBatch(12, 100).share(5)


def test_locate_finds_file_and_record() -> None:
    counts = [3, 0, 5, 2]
    expected = [(0, 0), (0, 1), (0, 2), (2, 0), (2, 1), (2, 2), (2, 3), (2, 4), (3, 0), (3, 1)]
    assert [locate(counts, i) for i in range(10)] == expected
    with pytest.raises(JobKitError, match="past the 10 records"):
        locate(counts, 10)


def test_changed_shards_are_named() -> None:
    recorded = [Shard("a.tfrecord", 100, 3), Shard("b.tfrecord", 200, 4)]
    check_same_shards(recorded, [("a.tfrecord", 100), ("b.tfrecord", 200)], "/d", "m.json")
    with pytest.raises(JobKitError) as err:
        check_same_shards(recorded, [("a.tfrecord", 101), ("c.tfrecord", 5)], "/d", "m.json")
    message = str(err.value)
    assert "\n" not in message
    assert "gone: b.tfrecord" in message and "new: c.tfrecord" in message and "changed size: a.tfrecord" in message
